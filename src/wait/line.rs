//! The line of parked callers, in the order a [`QueueOrder`] gives them
//! their slots.

use crate::ticket::Ticket;
use crate::wait::order::{Comparator, QueueOrder, WaitingCall};
use std::collections::BTreeMap;
use std::fmt;

/// Where an entry is in a [`Line`]: given when it is pushed, and by
/// `peek_next`, to take or remove it.
/// Its key: its place in line (0 but under an order by priority) and its
/// rank there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Place((i64, u64));

/// The parked callers, allocated when the first one parks: a bulkhead
/// whose callers never wait (every key of a keyed bulkhead without a wait
/// budget) keeps a word for it.
pub(crate) struct Line<T> {
    entries: Option<Box<Entries<T>>>,
}

/// How many callers of each priority wait in a line never used.
static NO_DEPTHS: BTreeMap<i32, usize> = BTreeMap::new();

impl<T> Line<T> {
    /// A line of `order`, allocated at once: for tests.
    #[cfg(all(test, not(tower_inflight_loom)))]
    pub(crate) fn new(order: QueueOrder) -> Self {
        Self {
            entries: Some(Box::new(Entries::new(order))),
        }
    }

    /// Puts `entry` in a line made by [`new`](Self::new): for tests.
    #[cfg(all(test, not(tower_inflight_loom)))]
    pub(crate) fn push(&mut self, priority: i32, weight: usize, entry: T) -> Place {
        let entries = self.entries.as_mut().expect("a line made with its order");
        entries.push_ticket(Ticket::new().priority(priority).weight(weight), entry)
    }

    /// Puts `entry` in the line where `ticket` goes, under `order` (the
    /// bulkhead's, always the same); returns where, to
    /// [`remove`](Self::remove) it if it leaves before it is served.
    pub(crate) fn push_ticket(&mut self, order: &QueueOrder, ticket: Ticket, entry: T) -> Place {
        self.entries
            .get_or_insert_with(|| Box::new(Entries::new(order.clone())))
            .push_ticket(ticket, entry)
    }

    /// The next entry to serve, `waiting` being how many are really
    /// parked, and where it is, to [`take`](Self::take) it.
    pub(crate) fn peek_next(&self, waiting: usize) -> Option<(Place, &T)> {
        self.entries.as_ref()?.peek_next(waiting)
    }

    /// Takes the entry at `place`, as [`peek_next`](Self::peek_next) gave it.
    pub(crate) fn take(&mut self, place: Place) -> T {
        self.remove(place)
            .expect("a place in the line was taken twice")
    }

    /// Removes the entry at `place`, if it is still there.
    pub(crate) fn remove(&mut self, place: Place) -> Option<T> {
        self.entries.as_mut()?.remove(place)
    }

    /// Moves the entry at `place` to `to` in an order by priority (see
    /// `Entries::move_to`); returns where it is now.
    pub(crate) fn move_to(&mut self, place: Place, to: i64) -> Place {
        match &mut self.entries {
            Some(entries) => entries.move_to(place, to),
            None => place,
        }
    }

    /// How many entries the line holds.
    #[cfg(all(test, not(tower_inflight_loom)))]
    pub(crate) fn len(&self) -> usize {
        self.entries
            .as_ref()
            .map_or(0, |entries| entries.keyed.len())
    }

    /// Takes the next entry to serve.
    #[cfg(all(test, not(tower_inflight_loom)))]
    pub(crate) fn pop_next(&mut self, waiting: usize) -> Option<T> {
        let (place, _) = self.peek_next(waiting)?;
        Some(self.take(place))
    }

    /// A caller of `priority` stopped waiting (served, refused or gone).
    pub(crate) fn left(&mut self, priority: i32) {
        if let Some(entries) = &mut self.entries {
            entries.left(priority);
        }
    }

    /// How many callers of each priority are waiting.
    pub(crate) fn depths(&self) -> &BTreeMap<i32, usize> {
        self.entries
            .as_ref()
            .map_or(&NO_DEPTHS, |entries| &entries.depths)
    }

    /// Takes every entry out.
    pub(crate) fn drain(&mut self) -> impl Iterator<Item = T> {
        self.entries
            .as_mut()
            .map(|entries| entries.drain())
            .into_iter()
            .flatten()
    }

    /// Forgets every entry; only once none is waiting. The line stays
    /// allocated for the next caller to park.
    pub(crate) fn clear(&mut self) {
        if let Some(entries) = &mut self.entries {
            entries.clear();
        }
    }
}

/// The entries of a line. The built-in orders are keyed so that the map's
/// first entry is the next to be served (for `AdaptiveLifo`, the first or
/// the last, by length); a custom order is searched. Every entry is a
/// caller still waiting: one that leaves is removed where it stands, so
/// the line's memory is bounded by the callers waiting, whatever the order.
struct Entries<T> {
    order: QueueOrder,
    next_seq: u64,
    /// By place in line and rank; a custom order's by arrival alone.
    keyed: BTreeMap<(i64, u64), (WaitingCall, T)>,
    /// How many callers of each priority are still waiting: counted in by
    /// `push`, out by `left`.
    depths: BTreeMap<i32, usize>,
}

impl<T> Entries<T> {
    fn new(order: QueueOrder) -> Self {
        Self {
            order,
            next_seq: 0,
            keyed: BTreeMap::new(),
            depths: BTreeMap::new(),
        }
    }

    /// Puts `entry` in the line where `ticket` goes (its place in line,
    /// under an order by priority); returns where, to
    /// [`remove`](Self::remove) it if it leaves before it is served.
    fn push_ticket(&mut self, ticket: Ticket, entry: T) -> Place {
        let (priority, weight) = (ticket.get_priority(), ticket.get_weight());
        let seq = self.next_seq;
        self.next_seq += 1;
        let call = WaitingCall {
            priority,
            weight,
            arrival: seq,
        };
        *self.depths.entry(priority).or_default() += 1;
        let newest_first = u64::MAX - seq;
        let key = match self.order {
            QueueOrder::Fifo | QueueOrder::AdaptiveLifo { .. } | QueueOrder::Custom(_) => (0, seq),
            QueueOrder::Lifo => (0, newest_first),
            QueueOrder::PriorityFifo => (ticket.get_place_in_line(), seq),
            QueueOrder::PriorityLifo => (ticket.get_place_in_line(), newest_first),
        };
        self.keyed.insert(key, (call, entry));
        Place(key)
    }

    fn peek_next(&self, waiting: usize) -> Option<(Place, &T)> {
        match &self.order {
            QueueOrder::AdaptiveLifo { after } if waiting > *after => {
                self.keyed.last_key_value().map(keyed_place)
            }
            QueueOrder::Custom(compare) => self.first_compared(compare),
            _ => self.keyed.first_key_value().map(keyed_place),
        }
    }

    fn remove(&mut self, place: Place) -> Option<T> {
        let Place(key) = place;
        self.keyed.remove(&key).map(|(_, entry)| entry)
    }

    /// Moves the entry at `place` to `to` in an order by priority, keeping
    /// its rank among entries of the same place (its arrival); returns
    /// where it is now. An entry no longer there is not put back.
    fn move_to(&mut self, place: Place, to: i64) -> Place {
        let Place((from, rank)) = place;
        if !matches!(
            self.order,
            QueueOrder::PriorityFifo | QueueOrder::PriorityLifo
        ) {
            return place; // an order that looks at no place
        }
        match self.keyed.remove(&(from, rank)) {
            Some(entry) => {
                self.keyed.insert((to, rank), entry);
                Place((to, rank))
            }
            None => place,
        }
    }

    fn first_compared(&self, compare: &Comparator) -> Option<(Place, &T)> {
        self.keyed
            .iter()
            .min_by(|(_, (a, _)), (_, (b, _))| (compare.0)(a, b).then(a.arrival.cmp(&b.arrival)))
            .map(keyed_place)
    }

    fn left(&mut self, priority: i32) {
        if let Some(depth) = self.depths.get_mut(&priority) {
            *depth -= 1;
            if *depth == 0 {
                self.depths.remove(&priority);
            }
        }
    }

    fn drain(&mut self) -> impl Iterator<Item = T> {
        std::mem::take(&mut self.keyed)
            .into_values()
            .map(|(_, entry)| entry)
    }

    fn clear(&mut self) {
        self.keyed.clear();
        self.depths.clear();
    }
}

fn keyed_place<'a, T>((key, (_, entry)): (&(i64, u64), &'a (WaitingCall, T))) -> (Place, &'a T) {
    (Place(*key), entry)
}

impl<T> Default for Line<T> {
    fn default() -> Self {
        Self { entries: None }
    }
}

impl<T: fmt::Debug> fmt::Debug for Line<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let entries = self.entries.as_deref();
        f.debug_struct("Line")
            .field("order", &entries.map(|entries| &entries.order))
            .field("len", &entries.map_or(0, |entries| entries.keyed.len()))
            .finish()
    }
}

#[cfg(all(test, not(tower_inflight_loom)))]
mod tests {
    use super::*;

    fn served(order: QueueOrder, arrivals: &[(i32, char)]) -> String {
        let mut line = Line::new(order);
        for &(priority, name) in arrivals {
            line.push(priority, 1, name);
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

    /// One line of each order, a custom one by priority among them.
    fn every_order() -> [QueueOrder; 6] {
        [
            QueueOrder::Fifo,
            QueueOrder::Lifo,
            QueueOrder::PriorityFifo,
            QueueOrder::PriorityLifo,
            QueueOrder::AdaptiveLifo { after: 1 },
            QueueOrder::custom(|a, b| a.priority().cmp(&b.priority())),
        ]
    }

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
    fn a_custom_order_serves_by_its_comparator_then_oldest_first() {
        let heaviest_first = QueueOrder::custom(|a, b| b.weight().cmp(&a.weight()));
        let mut line = Line::new(heaviest_first);
        for (weight, name) in [(1, 'a'), (3, 'b'), (1, 'c'), (3, 'd')] {
            line.push(0, weight, name);
        }
        let served: String = std::iter::from_fn(|| line.pop_next(0)).collect();
        assert_eq!(served, "bdac");
    }

    #[test]
    fn an_entry_removed_from_the_middle_is_gone_under_every_order() {
        for order in every_order() {
            let mut line = Line::new(order.clone());
            let places: Vec<Place> = ARRIVALS
                .iter()
                .map(|&(priority, name)| line.push(priority, 1, name))
                .collect();
            assert_eq!(line.remove(places[2]), Some('c'), "{order:?}");
            assert_eq!(line.remove(places[2]), None, "{order:?}");
            assert_eq!(line.len(), 3, "{order:?}");
            let mut served: Vec<char> = line.drain().collect();
            served.sort_unstable();
            assert_eq!(served, ['a', 'b', 'd'], "{order:?}");
        }
    }

    /// A move changes a line ordered by priority only: under the others, a
    /// freed slot still goes to whoever their order says (promise 4: new
    /// arrivals never overtake parked callers). A moved entry leaves by its
    /// new place, and one no longer there is never put back.
    #[test]
    fn a_move_reorders_a_line_by_priority_only_and_leaves_nothing_behind() {
        for order in every_order() {
            let unmoved = served(order.clone(), ARRIVALS);
            let by_priority = matches!(order, QueueOrder::PriorityFifo | QueueOrder::PriorityLifo);
            let mut line = Line::new(order.clone());
            let places: Vec<Place> = ARRIVALS
                .iter()
                .map(|&(priority, name)| line.push(priority, 1, name))
                .collect();
            let last = places[ARRIVALS.len() - 1];
            let moved = line.move_to(last, i64::MIN);
            assert_eq!(moved != last, by_priority, "{order:?}");
            let next = line.peek_next(ARRIVALS.len()).map(|(_, &name)| name);
            let expected = if by_priority {
                Some('d')
            } else {
                unmoved.chars().next()
            };
            assert_eq!(next, expected, "{order:?}");
            assert_eq!(line.remove(moved), Some('d'), "{order:?}");
            assert_eq!(
                line.move_to(moved, 0),
                moved,
                "{order:?}: gone, not put back"
            );
            assert_eq!(line.len(), ARRIVALS.len() - 1, "{order:?}");
        }
    }
}
