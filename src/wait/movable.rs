//! A place in the line that its owner may move while the caller waits.

use crate::sync::{lock, Arc, Mutex};
use crate::wait::Node;

/// Where a waiting caller stands in a line ordered by priority, which
/// someone other than the caller may change while it waits: the keyed
/// bulkhead moves a key's last caller into the place of one that gave up,
/// so that callers who leave do not push their key's others back.
///
/// Read and written only under the line's lock (the place when the caller
/// comes to the line, and both when it is moved), so a move and an arrival
/// never miss each other: a caller not yet in line goes to the moved place,
/// one in line is moved there.
#[derive(Debug)]
pub(crate) struct MovablePlace(Mutex<Movable>);

#[derive(Debug)]
struct Movable {
    place: i64,
    /// The caller's node, once it comes to the line.
    node: Option<Arc<Node>>,
}

impl MovablePlace {
    pub(crate) fn new(place: i64) -> Self {
        Self(Mutex::new(Movable { place, node: None }))
    }

    /// Where the caller of `node` goes, its node noted: under the line's
    /// lock, as it comes to the line.
    pub(crate) fn arrive(&self, node: Arc<Node>) -> i64 {
        let mut movable = lock(&self.0);
        movable.node = Some(node);
        movable.place
    }

    /// Moves the place to `place`, and the caller's node with it if it is
    /// in line (`moved`, under the line's lock).
    pub(crate) fn move_to(&self, place: i64, moved: impl FnOnce(&Node)) {
        let mut movable = lock(&self.0);
        movable.place = place;
        if let Some(node) = &movable.node {
            moved(node);
        }
    }
}
