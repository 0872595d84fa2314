//! Locking a std mutex.

use std::sync::Mutex;

/// Locks a std mutex, ignoring poisoning: every critical section here leaves the data valid.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
