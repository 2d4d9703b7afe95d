//! An entry's placement state: what the catalog knows of the entry's copy, and on which tier it
//! is. Every party reads it through `StateWord::state` (the one place a stored word is decoded);
//! `lifecycle` is the only module that makes words — a table's initial ones included — and moves
//! them.
//!
//! Stored as the first `AtomicU64` of the entry's state block (`layout::STATE_WORD`): the state's
//! number in bits 0–7, the tier in bits 8–15, the rest zero (table format `layout::VERSION`).

/// Where an entry stands. The numbers are the table format's.
#[repr(u8)]
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum State {
    /// Not cached; opens go to the source and ask the agent to place it.
    Unplaced = 0,
    /// The agent accepted a request and will copy it.
    Queued = 1,
    /// A copy is being written (under a temporary name: never visible to clients).
    Placing = 2,
    /// A complete copy exists in the tier named by the state word.
    Placed = 3,
    /// Never cached (unreadable for the agent, no tier has room, not a regular file); served from
    /// the catalog's metadata, opened on the source.
    SourceOnly = 4,
    /// The source changed under us (a client opened it for writing): the catalog's metadata and
    /// any copy are void; every call passes through.
    Stale = 5,
    /// Too large for any tier's free space: some chunks live in `<object>.chunks` in the tier
    /// named by the state word; the chunk bitmap says which.
    Partial = 6,
    /// The path no longer names what the catalog describes, nor does any path below it (the
    /// program renamed or removed it through granary): every call on it or under it passes
    /// through. Terminal, like `Stale`.
    Gone = 7,
}

impl State {
    /// True for the terminal states in which the catalog answers nothing about the entry.
    #[inline]
    pub const fn is_void(self) -> bool {
        matches!(self, State::Stale | State::Gone)
    }
}

/// An entry's state word as stored: a `State` and a tier. Compare-and-swap transitions take the
/// word a party inspected as their expected value, so a word is passed on whole, never rebuilt.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct StateWord(u64);

impl StateWord {
    /// `Stale` on no tier: the word of an entry the catalog answers nothing about, and what an
    /// index outside the table reads as.
    pub(crate) const VOID: StateWord = StateWord::new(State::Stale, 0);

    /// The word of `state` on `tier`: for `lifecycle` only.
    #[inline]
    pub(crate) const fn new(state: State, tier: u8) -> StateWord {
        StateWord(state as u64 | (tier as u64) << 8)
    }

    /// A word as read from storage.
    #[inline]
    pub(crate) const fn from_bits(bits: u64) -> StateWord {
        StateWord(bits)
    }

    /// The word as stored.
    #[inline]
    pub(crate) const fn bits(self) -> u64 {
        self.0
    }

    /// The state. A number no version of the format writes (a damaged table) reads as `Stale`:
    /// the catalog then answers nothing about the entry and every call passes through.
    #[inline]
    pub const fn state(self) -> State {
        match self.0 as u8 {
            0 => State::Unplaced,
            1 => State::Queued,
            2 => State::Placing,
            3 => State::Placed,
            4 => State::SourceOnly,
            6 => State::Partial,
            7 => State::Gone,
            _ => State::Stale,
        }
    }

    /// The tier the copy is on (meaningful for `Placing`, `Placed` and `Partial`).
    #[inline]
    pub const fn tier(self) -> u8 {
        (self.0 >> 8) as u8
    }

    /// The state and the tier.
    #[inline]
    pub const fn parts(self) -> (State, u8) {
        (self.state(), self.tier())
    }

    /// True in the terminal states in which the catalog answers nothing about the entry.
    #[inline]
    pub const fn is_void(self) -> bool {
        self.state().is_void()
    }
}

impl std::fmt::Debug for StateWord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}|{}", self.state(), self.tier())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_keep_the_format() {
        let all = [
            State::Unplaced,
            State::Queued,
            State::Placing,
            State::Placed,
            State::SourceOnly,
            State::Stale,
            State::Partial,
            State::Gone,
        ];
        for (n, s) in all.into_iter().enumerate() {
            assert_eq!(s as u8, n as u8);
            for tier in [0u8, 1, 7, 255] {
                let w = StateWord::new(s, tier);
                assert_eq!(w.bits(), n as u64 | (tier as u64) << 8);
                assert_eq!(w.parts(), (s, tier));
                assert_eq!(StateWord::from_bits(w.bits()), w);
            }
        }
        assert_eq!(StateWord::default().parts(), (State::Unplaced, 0));
        assert_eq!(StateWord::from_bits(8).state(), State::Stale);
        assert_eq!(
            StateWord::from_bits(0xff | 2 << 8).parts(),
            (State::Stale, 2)
        );
    }
}
