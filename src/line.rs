//! The line of parked callers, in the order a [`QueueOrder`] gives them
//! their slots.

use std::collections::BTreeMap;

/// In which order callers waiting for a slot get one. Whatever the order,
/// the head of the line is never bypassed: a freed slot goes to the caller
/// the order puts first, and new arrivals never take a slot while anyone is
/// parked.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum QueueOrder {
    /// The longest-waiting caller first. The default: fair, and every wait
    /// is bounded by the budget anyway.
    #[default]
    Fifo,
    /// The newest caller first: under a backlog, the callers most likely to
    /// still be there (and within their own deadlines) are served, and the
    /// oldest expire.
    Lifo,
    /// The lowest priority value first; equal priorities oldest first.
    PriorityFifo,
    /// The lowest priority value first; equal priorities newest first.
    PriorityLifo,
    /// First in, first out while at most `after` callers wait; newest first
    /// once the line is longer, as in Meta's "Fail at Scale": a short line
    /// is a burst that FIFO serves fairly, a long one is overload that LIFO
    /// serves without letting everyone's latency grow.
    AdaptiveLifo {
        /// The length of line past which the newest are served first.
        after: usize,
    },
}

/// The parked callers, keyed so that the map's first entry is the next to
/// be served (for `AdaptiveLifo`, the first or the last, by length).
#[derive(Debug)]
pub(crate) struct Line<T> {
    order: QueueOrder,
    next_seq: u64,
    entries: BTreeMap<(i64, u64), T>,
}

impl<T> Line<T> {
    pub(crate) fn new(order: QueueOrder) -> Self {
        Self {
            order,
            next_seq: 0,
            entries: BTreeMap::new(),
        }
    }

    pub(crate) fn push(&mut self, priority: i32, entry: T) {
        let seq = self.next_seq;
        self.next_seq += 1;
        let newest_first = u64::MAX - seq;
        let key = match self.order {
            QueueOrder::Fifo | QueueOrder::AdaptiveLifo { .. } => (0, seq),
            QueueOrder::Lifo => (0, newest_first),
            QueueOrder::PriorityFifo => (i64::from(priority), seq),
            QueueOrder::PriorityLifo => (i64::from(priority), newest_first),
        };
        self.entries.insert(key, entry);
    }

    /// The next entry to serve, `waiting` being how many are really parked.
    pub(crate) fn pop_next(&mut self, waiting: usize) -> Option<T> {
        match self.order {
            QueueOrder::AdaptiveLifo { after } if waiting > after => {
                self.entries.pop_last().map(|(_, entry)| entry)
            }
            _ => self.entries.pop_first().map(|(_, entry)| entry),
        }
    }

    /// Drops entries from both ends while `finished` says they are done:
    /// callers that gave up are left in place and skipped, so they gather
    /// at the ends, where the oldest expire first.
    pub(crate) fn prune(&mut self, finished: impl Fn(&T) -> bool) {
        while self
            .entries
            .first_key_value()
            .is_some_and(|(_, entry)| finished(entry))
        {
            self.entries.pop_first();
        }
        while self
            .entries
            .last_key_value()
            .is_some_and(|(_, entry)| finished(entry))
        {
            self.entries.pop_last();
        }
    }

    pub(crate) fn drain(&mut self) -> impl Iterator<Item = T> {
        std::mem::take(&mut self.entries).into_values()
    }

    pub(crate) fn clear(&mut self) {
        self.entries.clear();
    }
}

impl<T> Default for Line<T> {
    fn default() -> Self {
        Self::new(QueueOrder::Fifo)
    }
}

#[cfg(all(test, not(tower_inflight_loom)))]
mod tests {
    use super::*;

    fn served(order: QueueOrder, arrivals: &[(i32, char)]) -> String {
        let mut line = Line::new(order);
        for &(priority, name) in arrivals {
            line.push(priority, name);
        }
        let mut waiting = arrivals.len();
        std::iter::from_fn(|| {
            let next = line.pop_next(waiting);
            waiting = waiting.saturating_sub(1);
            next
        })
        .collect()
    }

    const ARRIVALS: &[(i32, char)] = &[(1, 'a'), (0, 'b'), (1, 'c'), (0, 'd')];

    #[test]
    fn each_order_serves_its_own_sequence() {
        assert_eq!(served(QueueOrder::Fifo, ARRIVALS), "abcd");
        assert_eq!(served(QueueOrder::Lifo, ARRIVALS), "dcba");
        assert_eq!(served(QueueOrder::PriorityFifo, ARRIVALS), "bdac");
        assert_eq!(served(QueueOrder::PriorityLifo, ARRIVALS), "dbca");
        // Longer than 2: newest first, until 2 are left: then oldest first.
        assert_eq!(
            served(QueueOrder::AdaptiveLifo { after: 2 }, ARRIVALS),
            "dcab"
        );
    }

    #[test]
    fn prune_drops_finished_entries_at_both_ends_only() {
        let mut line = Line::new(QueueOrder::Fifo);
        for (i, done) in [true, false, true, false, true].into_iter().enumerate() {
            line.push(0, (i, done));
        }
        line.prune(|&(_, done)| done);
        let left: Vec<usize> = line.drain().map(|(i, _)| i).collect();
        assert_eq!(left, [1, 2, 3]);
    }
}
