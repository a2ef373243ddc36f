//! [`ThreadBound`]: a `RefCell` that may be *shared* across threads (it is
//! `Sync`) but only *used* on the thread that created it — every access
//! checks the caller's thread and panics otherwise.
//!
//! For single-threaded backends behind the `Send + Sync` fabric traits (the
//! simulator runs everything on one OS thread): a `Mutex` would cost two
//! atomic read-modify-writes per call on a path taken several times per
//! simulated verb; this costs a thread-local address and a compare.

use std::cell::{Ref, RefCell, RefMut};

thread_local! {
    // Only its address matters: distinct for every live thread.
    static KEY: u8 = const { 0 };
}

/// An identifier of the calling thread, unique among live threads.
#[inline]
fn thread_key() -> usize {
    KEY.with(|k| k as *const u8 as usize)
}

/// A value used only on its creating thread (see the module docs).
pub struct ThreadBound<T> {
    owner: usize,
    cell: RefCell<T>,
}

// SAFETY: the cell is only reached through `borrow`/`borrow_mut`, which
// check that the caller is the owning thread before touching it, so the
// RefCell's non-atomic borrow flag and the value are never accessed from two
// threads. Moving or dropping the wrapper on another thread moves or drops a
// `T`, which requires `T: Send`.
unsafe impl<T: Send> Sync for ThreadBound<T> {}

impl<T> ThreadBound<T> {
    /// Binds `value` to the calling thread.
    pub fn new(value: T) -> Self {
        Self {
            owner: thread_key(),
            cell: RefCell::new(value),
        }
    }

    #[inline]
    fn check(&self) {
        assert!(
            thread_key() == self.owner,
            "a thread-bound value (e.g. the simulator's engine) was used from another OS thread"
        );
    }

    /// Shared access.
    ///
    /// # Panics
    /// On another thread, or while mutably borrowed (programmer errors).
    #[inline]
    pub fn borrow(&self) -> Ref<'_, T> {
        self.check();
        self.cell.borrow()
    }

    /// Exclusive access.
    ///
    /// # Panics
    /// On another thread, or while borrowed (programmer errors).
    #[inline]
    pub fn borrow_mut(&self) -> RefMut<'_, T> {
        self.check();
        self.cell.borrow_mut()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn usable_on_its_thread_and_refused_elsewhere() {
        let b = Arc::new(ThreadBound::new(5u32));
        *b.borrow_mut() += 1;
        assert_eq!(*b.borrow(), 6);
        let b2 = b.clone();
        let r = std::thread::spawn(move || {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| *b2.borrow())).is_err()
        })
        .join()
        .unwrap();
        assert!(r, "another thread must not read it");
        assert_eq!(*b.borrow(), 6);
    }
}
