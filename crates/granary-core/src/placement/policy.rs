use crate::tiers::Tiers;

/// Chooses where a file goes: the tiers to try, in order. The placement engine will add policies
/// (spill, known access order) behind this trait.
pub trait Policy: Send + Sync {
    fn tiers_for(&self, size: u64, tiers: &Tiers) -> Vec<usize>;
}

/// The fastest tier with room, then the next: tiers are configured fastest first.
#[derive(Debug, Default, Clone, Copy)]
pub struct FillHighestFirst;

impl Policy for FillHighestFirst {
    fn tiers_for(&self, _size: u64, tiers: &Tiers) -> Vec<usize> {
        (0..tiers.len()).collect()
    }
}
