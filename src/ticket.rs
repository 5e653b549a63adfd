//! What a call asks of the bulkhead besides one slot: a place in line and a
//! weight.

/// A call's priority in the line of waiting callers and its weight in slots.
///
/// The default, `Ticket::new()`, is priority 0 and weight 1: what every
/// plain [`acquire`](crate::Bulkhead::acquire) uses. Give it to
/// [`Bulkhead::acquire_with`](crate::Bulkhead::acquire_with), return it from
/// a [`ConcurrencyLayer::classify`](crate::ConcurrencyLayer::classify)
/// classifier, or, with the `http` feature, put it in a request's extensions
/// for an [`HttpConcurrencyLayer`](crate::http::HttpConcurrencyLayer) that
/// reads it there.
///
/// ```
/// use tower_inflight::Ticket;
///
/// let report = Ticket::new().priority(10).weight(4); // low priority, four slots
/// assert_eq!((report.get_priority(), report.get_weight()), (10, 4));
/// assert_eq!(Ticket::default(), Ticket::new().priority(0).weight(1));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Ticket {
    priority: i32,
    weight: usize,
    /// Where the caller goes in a line ordered by priority, in place of its
    /// priority: for the crate's own orders, which need more than 32 bits
    /// (the turns of a keyed bulkhead's ceiling).
    place: Option<i64>,
}

impl Ticket {
    /// Priority 0, weight 1.
    pub const fn new() -> Self {
        Self {
            priority: 0,
            weight: 1,
            place: None,
        }
    }

    /// The place in line, with a [`QueueOrder`](crate::QueueOrder) that
    /// looks at priorities: the lower the value, the sooner the slot. A
    /// priority orders the line; it never lets a caller take a slot while
    /// others wait.
    pub const fn priority(mut self, priority: i32) -> Self {
        self.priority = priority;
        self
    }

    /// How many slots the call takes, all at once or not at all: for work
    /// that costs several times what a plain call does. Between 1 and the
    /// bulkhead's limit; any other weight is refused with
    /// [`ShedReason::InvalidWeight`](crate::ShedReason::InvalidWeight).
    pub const fn weight(mut self, weight: usize) -> Self {
        self.weight = weight;
        self
    }

    /// The priority.
    pub const fn get_priority(&self) -> i32 {
        self.priority
    }

    /// The weight.
    pub const fn get_weight(&self) -> usize {
        self.weight
    }

    /// Goes to `place` in a line ordered by priority (lower first), while
    /// its priority still names it in the metrics.
    pub(crate) const fn place_in_line(mut self, place: i64) -> Self {
        self.place = Some(place);
        self
    }

    /// Where the caller goes in a line ordered by priority.
    pub(crate) const fn get_place_in_line(&self) -> i64 {
        match self.place {
            Some(place) => place,
            None => self.priority as i64,
        }
    }
}

impl Default for Ticket {
    fn default() -> Self {
        Self::new()
    }
}
