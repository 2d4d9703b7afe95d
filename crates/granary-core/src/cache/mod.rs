//! The cache as the user's: the copies of each source in each tier outlive the table that placed
//! them, whatever the next job asks for.
//!
//! - `copies`: the record of a source's copies in one tier, saved beside them, and `journal`:
//!   the copies published since, appended as they land (an agent killed between two saves costs
//!   none of them);
//! - `adopt`: a new table takes over recorded copies — its own, and those of the same dataset
//!   served another way (plainly, from its pack, mounted) — instead of placing them again;
//! - `registry`: the tier roots the user's agents have used;
//! - `inventory`, `verify`, `remove`: what `granary cache` lists, checks and cleans.
//!
//! Copies go only when capacity requires it (the placement policy: docs/cache.md) or the user
//! asks (`granary cache clean`); a copy of a file that changed on the source, or one no record
//! vouches for, is removed by the source's next job (`placement::sweep`).

pub mod adopt;
pub mod copies;
pub mod inventory;
pub mod journal;
pub mod registry;
pub mod remove;
pub mod verify;
