//! Requests that do not depend on each other, made several at a time: each is a round trip on
//! an object store, and a commit over thousands of ranks must not make thousands of them one
//! after another.

use weightbay::{Error, ErrorKind, Result};

/// At most this many requests of one [`each`] are in flight.
const PARALLEL_REQUESTS: usize = 64;

/// `request` of every item, in order, made on up to [`PARALLEL_REQUESTS`] threads; the first
/// error in that order, if any. A request that panics is an [`ErrorKind::Io`] error for its
/// item and the ones after it on its thread, not a panic of the caller.
pub(crate) fn each<T, R, F>(items: &[T], request: F) -> Result<Vec<R>>
where
    T: Sync,
    R: Send,
    F: Fn(&T) -> Result<R> + Sync,
{
    let mut items: Vec<&T> = items.iter().collect();
    each_mut(&mut items, |item| request(item))
}

/// [`each`] for requests that fill their item (a buffer to read into).
pub(crate) fn each_mut<T, R, F>(items: &mut [T], request: F) -> Result<Vec<R>>
where
    T: Send,
    R: Send,
    F: Fn(&mut T) -> Result<R> + Sync,
{
    if items.len() <= 1 {
        return items.iter_mut().map(request).collect();
    }
    let per_thread = items.len().div_ceil(PARALLEL_REQUESTS).max(1);
    let mut results: Vec<Option<Result<R>>> = (0..items.len()).map(|_| None).collect();
    std::thread::scope(|scope| {
        let request = &request;
        let threads: Vec<_> = results
            .chunks_mut(per_thread)
            .zip(items.chunks_mut(per_thread))
            .map(|(out, items)| {
                scope.spawn(move || {
                    for (slot, item) in out.iter_mut().zip(items) {
                        *slot = Some(request(item));
                    }
                })
            })
            .collect();
        // Joined here, so a panic is taken (its slots stay empty) instead of re-raised when
        // the scope ends.
        for thread in threads {
            let _ = thread.join();
        }
    });
    results
        .into_iter()
        .map(|r| r.unwrap_or_else(|| Err(Error::new(ErrorKind::Io, "a request panicked"))))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_come_in_order_and_the_first_error_wins() {
        let items: Vec<u32> = (0..200).collect();
        assert_eq!(each(&items, |&i| Ok(i * 2)).unwrap()[199], 398);
        let failed = each(&items, |&i| {
            if i % 70 == 69 {
                Err(Error::invalid(format!("item {i}")))
            } else {
                Ok(i)
            }
        });
        assert!(failed.unwrap_err().to_string().contains("item 69"));
        assert!(each(&[] as &[u32], |&i| Ok(i)).unwrap().is_empty());
        let panicked = each(&items, |&i| {
            assert!(i != 150, "a request that panics");
            Ok(i)
        });
        assert_eq!(panicked.unwrap_err().kind(), ErrorKind::Io);
    }
}
