//! granary core (being written).
