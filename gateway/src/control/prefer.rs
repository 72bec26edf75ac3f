//! A waiter's preferred group (its conversation's prefix is cached there): what admission asks
//! of that group (`Home`), how long the waiter holds out for it (`Preference`), and the slot held
//! there between its grant and its lease (`Reservation`).

use std::sync::Arc;
use std::time::Duration;

/// What admission asks of a group a waiter prefers.
pub(crate) trait Home: Send + Sync + std::fmt::Debug {
    /// Serving, with every slot taken, while no other group sits idle: a slot there is worth
    /// waiting for (a closed group's never is, nor one while another group does nothing).
    fn full(&self) -> bool;

    /// Serving, with a slot free.
    fn has_room(&self) -> bool;

    /// Holds one of its free slots for a request just admitted, until that request leases it
    /// (no other request may take it meanwhile); false when none is free.
    fn reserve(&self) -> bool;

    /// Gives a held slot back.
    fn unreserve(&self);

    /// Which group it is, in the order of the caller's list.
    fn index(&self) -> usize;
}

/// A slot of a preferred group held for an admitted request between its grant and its lease
/// (the waiter's task runs later than the dispatch that granted it, and another request's lease
/// could take the slot it waited for); given back when dropped.
#[derive(Debug)]
pub(crate) struct Reservation {
    home: Arc<dyn Home>,
    /// Its slot became the request's lease: nothing to give back.
    settled: bool,
}

impl Reservation {
    /// The group whose slot is held.
    pub(crate) fn home(&self) -> &Arc<dyn Home> {
        &self.home
    }

    /// The held slot became the request's lease (the group moved it).
    pub(crate) fn settle(mut self) {
        self.settled = true;
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if !self.settled {
            self.home.unreserve();
        }
    }
}

/// A slot of `prefer`'s group, when it has one free.
pub(super) fn reserve(prefer: Option<&Preference>) -> Option<Reservation> {
    let p = prefer?;
    p.home.reserve().then(|| Reservation {
        home: p.home.clone(),
        settled: false,
    })
}

/// The group a request would rather run on, and how long it waits for a slot there rather
/// than take one elsewhere.
#[derive(Debug, Clone)]
pub(crate) struct Preference {
    pub(crate) home: Arc<dyn Home>,
    pub(crate) wait: Duration,
}
