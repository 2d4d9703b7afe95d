//! How placing one entry ended (`PlaceOutcome`), as every kind of copy reports it.

/// How placing one entry ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PlaceOutcome {
    Placed {
        tier: usize,
        bytes: u64,
    },
    /// Not ours to place (someone else moved the state, or the table was retired).
    Skipped,
    /// The source no longer matches the catalog: the entry is STALE.
    Stale,
    /// No tier could take it (full, unwritable) or the source was unreadable: SOURCE_ONLY.
    SourceOnly,
}
