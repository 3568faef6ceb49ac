//! A linearizability checker in the manner of Knossos and Porcupine: the
//! Wing & Gong search with Lowe's memoisation. A history of completed
//! operations (call and return times, input, output) is linearizable when
//! some total order, consistent with real time (an operation that returned
//! before another was called comes first), replays on a sequential model
//! producing every observed output. Linearizability is local, so a history
//! over many keys is checked one key at a time.

use std::collections::HashSet;
use std::hash::Hash;

/// One completed operation.
#[derive(Debug, Clone)]
pub struct Operation<I, O> {
    /// When it was called and when it returned (any monotonic clock).
    pub call: u64,
    pub ret: u64,
    pub input: I,
    pub output: O,
}

/// A sequential specification.
pub trait Model {
    type State: Clone + Eq + Hash;
    type Input;
    type Output;
    fn init(&self) -> Self::State;
    /// The state after `input` if, applied to `state`, it can answer
    /// `output`; `None` if it cannot.
    fn step(
        &self,
        state: &Self::State,
        input: &Self::Input,
        output: &Self::Output,
    ) -> Option<Self::State>;
}

/// A linearization order (indices into the history), if there is one.
pub fn linearize<M: Model>(
    model: &M,
    history: &[Operation<M::Input, M::Output>],
) -> Option<Vec<usize>> {
    let n = history.len();
    let mut done = vec![false; n];
    let mut order = Vec::with_capacity(n);
    let mut seen: HashSet<(Vec<bool>, M::State)> = HashSet::new();
    if search(model, history, &mut done, &mut order, model.init(), &mut seen) {
        Some(order)
    } else {
        None
    }
}

fn search<M: Model>(
    model: &M,
    history: &[Operation<M::Input, M::Output>],
    done: &mut Vec<bool>,
    order: &mut Vec<usize>,
    state: M::State,
    seen: &mut HashSet<(Vec<bool>, M::State)>,
) -> bool {
    if order.len() == history.len() {
        return true;
    }
    // The next operation must have been called before every pending
    // operation returned.
    let horizon =
        (0..history.len()).filter(|i| !done[*i]).map(|i| history[i].ret).min().unwrap_or(u64::MAX);
    for i in 0..history.len() {
        if done[i] || history[i].call > horizon {
            continue;
        }
        let Some(next) = model.step(&state, &history[i].input, &history[i].output) else {
            continue;
        };
        done[i] = true;
        if seen.insert((done.clone(), next.clone())) {
            order.push(i);
            if search(model, history, done, order, next, seen) {
                return true;
            }
            order.pop();
        }
        done[i] = false;
    }
    false
}

/// The store-wide revision across keys: every acknowledged write made a
/// revision no other write made, and a write that returned before another
/// was called made a lower one. `writes` are (call, return, revision).
/// Returns the first violation found.
pub fn revisions_unique_and_in_real_time_order(writes: &[(u64, u64, i64)]) -> Result<(), String> {
    let mut seen = HashSet::new();
    for (_, _, revision) in writes {
        if !seen.insert(*revision) {
            return Err(format!("revision {revision} was made by two writes"));
        }
    }
    let mut by_return: Vec<&(u64, u64, i64)> = writes.iter().collect();
    by_return.sort_by_key(|w| w.1);
    let mut by_call: Vec<&(u64, u64, i64)> = writes.iter().collect();
    by_call.sort_by_key(|w| w.0);
    // Sweep the writes by call time, keeping the highest revision of the
    // writes that returned before it.
    let (mut returned, mut highest) = (0, None::<i64>);
    for w in by_call {
        while returned < by_return.len() && by_return[returned].1 < w.0 {
            highest = highest.max(Some(by_return[returned].2));
            returned += 1;
        }
        if let Some(h) = highest {
            if w.2 <= h {
                return Err(format!(
                    "revision {} was made by a write called after one that made {h} had returned",
                    w.2
                ));
            }
        }
    }
    Ok(())
}

/// Calls on one gateway, as a client sees them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Call {
    Create {
        image: String,
    },
    /// `precondition`: the resource_version the update requires (0: none).
    Update {
        image: String,
        precondition: i64,
    },
    Get,
    Delete {
        precondition: i64,
    },
}

/// What a call answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// A write succeeded, making this resource_version.
    Written {
        resource_version: i64,
    },
    Deleted,
    Read {
        image: String,
        resource_version: i64,
    },
    NotFound,
    AlreadyExists,
    /// The precondition did not match.
    Conflict,
    /// A write whose answer never came (the store was killed with it in
    /// flight): it may or may not have taken effect. Recorded as returning
    /// never, so that "not applied" is a linearization with it last.
    Maybe,
}

/// The resource_version of a state written by a [`Answer::Maybe`] write:
/// unknown until a read shows it.
pub const UNKNOWN_RV: i64 = -1;

/// One gateway as a register of (image, resource_version).
#[derive(Debug, Clone, Copy, Default)]
pub struct GatewayModel;

impl Model for GatewayModel {
    type State = Option<(String, i64)>;
    type Input = Call;
    type Output = Answer;

    fn init(&self) -> Self::State {
        None
    }

    fn step(&self, state: &Self::State, input: &Call, output: &Answer) -> Option<Self::State> {
        // An unknown version may be the one the precondition names, or not.
        let matches = |precondition: i64, rv: i64| {
            precondition == 0 || precondition == rv || rv == UNKNOWN_RV
        };
        let differs = |precondition: i64, rv: i64| {
            precondition != 0 && (precondition != rv || rv == UNKNOWN_RV)
        };
        match (input, output, state) {
            // A write that may have happened, as if it happened here.
            (Call::Create { image }, Answer::Maybe, None) => {
                Some(Some((image.clone(), UNKNOWN_RV)))
            }
            (Call::Update { image, precondition }, Answer::Maybe, Some((_, rv)))
                if matches(*precondition, *rv) =>
            {
                Some(Some((image.clone(), UNKNOWN_RV)))
            }
            (Call::Delete { precondition }, Answer::Maybe, Some((_, rv)))
                if matches(*precondition, *rv) =>
            {
                Some(None)
            }
            (_, Answer::Maybe, _) => Some(state.clone()),
            (Call::Create { .. }, Answer::AlreadyExists, Some(_)) => Some(state.clone()),
            (Call::Create { image }, Answer::Written { resource_version }, None) => {
                Some(Some((image.clone(), *resource_version)))
            }
            (
                Call::Update { image, precondition },
                Answer::Written { resource_version },
                Some((_, rv)),
            ) if matches(*precondition, *rv) && resource_version > rv => {
                Some(Some((image.clone(), *resource_version)))
            }
            (Call::Update { precondition, .. }, Answer::Conflict, Some((_, rv)))
                if differs(*precondition, *rv) =>
            {
                Some(state.clone())
            }
            (Call::Update { .. } | Call::Get | Call::Delete { .. }, Answer::NotFound, None) => {
                Some(None)
            }
            (Call::Get, Answer::Read { image, resource_version }, Some((i, rv)))
                if image == i && (resource_version == rv || *rv == UNKNOWN_RV) =>
            {
                Some(Some((i.clone(), *resource_version)))
            }
            (Call::Delete { precondition }, Answer::Deleted, Some((_, rv)))
                if matches(*precondition, *rv) =>
            {
                Some(None)
            }
            (Call::Delete { precondition }, Answer::Conflict, Some((_, rv)))
                if differs(*precondition, *rv) =>
            {
                Some(state.clone())
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(call: u64, ret: u64, input: Call, output: Answer) -> Operation<Call, Answer> {
        Operation { call, ret, input, output }
    }

    fn create(image: &str) -> Call {
        Call::Create { image: image.into() }
    }

    fn read(image: &str, rv: i64) -> Answer {
        Answer::Read { image: image.into(), resource_version: rv }
    }

    #[test]
    fn concurrent_operations_may_take_effect_in_either_order() {
        // The read overlaps the update: old or new value are both fine.
        let update = Call::Update { image: "b".into(), precondition: 0 };
        for seen in [read("a", 1), read("b", 2)] {
            let history = vec![
                op(0, 1, create("a"), Answer::Written { resource_version: 1 }),
                op(2, 5, update.clone(), Answer::Written { resource_version: 2 }),
                op(3, 4, Call::Get, seen),
            ];
            assert!(linearize(&GatewayModel, &history).is_some());
        }
    }

    #[test]
    fn a_stale_read_after_a_completed_write_is_not_linearizable() {
        let history = vec![
            op(0, 1, create("a"), Answer::Written { resource_version: 1 }),
            op(
                2,
                3,
                Call::Update { image: "b".into(), precondition: 1 },
                Answer::Written { resource_version: 2 },
            ),
            op(4, 5, Call::Get, read("a", 1)),
        ];
        assert!(linearize(&GatewayModel, &history).is_none());
    }

    #[test]
    fn two_updates_with_the_same_precondition_cannot_both_succeed() {
        let history = vec![
            op(0, 1, create("a"), Answer::Written { resource_version: 1 }),
            op(
                2,
                5,
                Call::Update { image: "b".into(), precondition: 1 },
                Answer::Written { resource_version: 2 },
            ),
            op(
                3,
                6,
                Call::Update { image: "c".into(), precondition: 1 },
                Answer::Written { resource_version: 3 },
            ),
        ];
        assert!(linearize(&GatewayModel, &history).is_none());
        let mut fixed = history.clone();
        fixed[2].output = Answer::Conflict;
        assert_eq!(linearize(&GatewayModel, &fixed), Some(vec![0, 1, 2]));
    }

    #[test]
    fn a_write_that_may_have_happened_is_either_applied_or_last() {
        let maybe =
            op(2, u64::MAX, Call::Update { image: "b".into(), precondition: 0 }, Answer::Maybe);
        let base = op(0, 1, create("a"), Answer::Written { resource_version: 1 });
        for seen in [read("a", 1), read("b", 7)] {
            let history = vec![base.clone(), maybe.clone(), op(3, 4, Call::Get, seen)];
            assert!(linearize(&GatewayModel, &history).is_some());
        }
        // It cannot have written a value nobody sent.
        let history = vec![base, maybe, op(3, 4, Call::Get, read("c", 7))];
        assert!(linearize(&GatewayModel, &history).is_none());
    }

    #[test]
    fn revisions_repeated_or_out_of_real_time_order_are_caught() {
        assert!(revisions_unique_and_in_real_time_order(&[(0, 1, 5), (2, 3, 6), (1, 4, 4)]).is_ok());
        assert!(revisions_unique_and_in_real_time_order(&[(0, 1, 5), (2, 3, 5)]).is_err());
        assert!(revisions_unique_and_in_real_time_order(&[(0, 1, 6), (2, 3, 5)]).is_err());
    }

    #[test]
    fn a_lost_delete_is_caught() {
        let history = vec![
            op(0, 1, create("a"), Answer::Written { resource_version: 1 }),
            op(2, 3, Call::Delete { precondition: 0 }, Answer::Deleted),
            op(4, 5, Call::Get, read("a", 1)),
        ];
        assert!(linearize(&GatewayModel, &history).is_none());
    }
}
