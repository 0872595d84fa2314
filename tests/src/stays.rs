//! Stays inside a semaphore, as `permit_worker` records them in its ledger (an independent
//! Redis whose commands run one at a time, so its counter orders every entry and exit), and a
//! checker that judges them: how many leases valid throughout their stay were inside at once,
//! tokens two leases shared, and tokens not above a lease that had left before the acquire.

use std::collections::BTreeMap;

/// One lease's stay inside, as the ledger holds it: `TOKEN ENTER EXIT VALID FLOOR`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stay {
    /// The lease's fencing token.
    pub token: u64,
    /// The ledger's counter on entering.
    pub enter: u64,
    /// The ledger's counter on leaving.
    pub exit: u64,
    /// Whether the lease was still valid on leaving (so all along its stay).
    pub valid: bool,
    /// The greatest token of the leases that had left before this one was asked for.
    pub floor: u64,
}

impl Stay {
    /// A stay from its ledger line, if it is one.
    pub fn parse(line: &str) -> Option<Self> {
        let mut fields = line.split(' ').map(str::parse::<u64>);
        let mut next = || fields.next()?.ok();
        Some(Self {
            token: next()?,
            enter: next()?,
            exit: next()?,
            valid: next()? == 1,
            floor: next()?,
        })
    }
}

/// What the stays show.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Judged {
    /// The most leases valid throughout their stays that were inside at once.
    pub most_inside: usize,
    /// Stays whose lease was no longer valid on leaving (left out of `most_inside`).
    pub invalid: usize,
    /// Tokens held by more than one stay.
    pub shared_tokens: Vec<u64>,
    /// Stays whose token was not above the floor they read before their acquire.
    pub below_floor: Vec<Stay>,
}

/// Judges `stays`.
pub fn judge(stays: &[Stay]) -> Judged {
    let mut judged = Judged::default();
    // +1 on entering, -1 on leaving, in the ledger's order.
    let mut events = BTreeMap::new();
    let mut tokens: BTreeMap<u64, usize> = BTreeMap::new();
    for stay in stays {
        *tokens.entry(stay.token).or_default() += 1;
        if stay.token <= stay.floor {
            judged.below_floor.push(*stay);
        }
        if !stay.valid {
            judged.invalid += 1;
            continue;
        }
        events.insert(stay.enter, 1i64);
        events.insert(stay.exit, -1i64);
    }
    let mut inside = 0i64;
    for step in events.values() {
        inside += step;
        judged.most_inside = judged.most_inside.max(usize::try_from(inside).unwrap_or(0));
    }
    judged.shared_tokens = tokens
        .into_iter()
        .filter(|&(_, count)| count > 1)
        .map(|(token, _)| token)
        .collect();
    judged
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stay(token: u64, enter: u64, exit: u64) -> Stay {
        Stay {
            token,
            enter,
            exit,
            valid: true,
            floor: 0,
        }
    }

    #[test]
    fn overlapping_stays_are_counted_in_the_ledgers_order() {
        // Two inside, then a third after one left: at most two.
        let stays = [stay(10, 1, 4), stay(11, 2, 6), stay(12, 5, 7)];
        assert_eq!(judge(&stays).most_inside, 2);
        // A third that entered before either left: three.
        let stays = [stay(10, 1, 4), stay(11, 2, 6), stay(12, 3, 7)];
        assert_eq!(judge(&stays).most_inside, 3);
        assert_eq!(judge(&[]).most_inside, 0);
    }

    #[test]
    fn a_stay_whose_lease_was_lost_is_left_out_but_counted() {
        let lost = Stay {
            valid: false,
            ..stay(12, 3, 7)
        };
        let judged = judge(&[stay(10, 1, 4), stay(11, 2, 6), lost]);
        assert_eq!((judged.most_inside, judged.invalid), (2, 1));
    }

    #[test]
    fn shared_tokens_and_tokens_not_above_their_floor_are_reported() {
        let below = Stay {
            floor: 12,
            ..stay(12, 5, 6)
        };
        let judged = judge(&[stay(10, 1, 2), stay(10, 3, 4), below]);
        assert_eq!(judged.shared_tokens, [10]);
        assert_eq!(judged.below_floor, [below]);
        assert_eq!(Stay::parse("12 5 6 1 12"), Some(below));
        assert_eq!(Stay::parse("12 5 6"), None);
    }
}
