//! The crate's one way to take a std lock. Every lock here guards data that is
//! consistent between statements and is never held across an `.await`, so a
//! lock poisoned by a panicking holder still guards usable data: it is taken
//! anyway rather than turning one task's panic into every task's.

use std::sync::{Mutex, MutexGuard};

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
