//! The fds granary opens and tracks: the tier copies it hands to the program (opened so that
//! nobody else's bytes are served), the record of every fd it knows and what for, and what it
//! does under such an fd — moving it between copy and source, serving one read from another
//! file, dropping a transient copy's pages.

pub mod copies;
pub mod fdtable;
pub mod pagedrop;
pub mod serve;
pub mod switch;
pub mod tracked;
