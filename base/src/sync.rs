//! The one way core takes a std lock: poison-tolerant.
//!
//! A std `Mutex`/`RwLock` is poisoned when a thread panics while holding it.
//! Every lock in core guards state that stays consistent between statements
//! (tables updated in one step, counters, file versions), so a panicked holder
//! leaves nothing half-done that the next caller could trip on. Refusing the
//! lock after that would turn one failed request into a broker that fails every
//! request until restart; so a poisoned lock is taken as it is. Other crates
//! use these too (`rocketgate_core::sync::lock`), so the rule lives in one place.

use std::sync::{Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Locks `m`, ignoring poison (see the module docs for why).
pub fn lock<T: ?Sized>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Read-locks `l`, ignoring poison.
pub fn read<T: ?Sized>(l: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(PoisonError::into_inner)
}

/// Write-locks `l`, ignoring poison.
pub fn write<T: ?Sized>(l: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panicked_holder_does_not_lock_others_out() {
        let m = std::sync::Arc::new(Mutex::new(1));
        let l = std::sync::Arc::new(RwLock::new(1));
        let (m2, l2) = (m.clone(), l.clone());
        let joined = std::thread::spawn(move || {
            let _g = m2.lock();
            let _w = l2.write();
            panic!("holder panics");
        })
        .join();
        assert!(joined.is_err());
        assert!(m.is_poisoned() && l.is_poisoned());
        *lock(&m) += 1;
        *write(&l) += 1;
        assert_eq!((*lock(&m), *read(&l)), (2, 2));
    }
}
