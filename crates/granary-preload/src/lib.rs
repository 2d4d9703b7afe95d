//! The interposition library (being written).
