//! When a controller looks at an object again: [`Next`], the backoff of failed attempts
//! ([`retry_at`]) and the growing wait on work that is still running ([`busy_retry`]). Pure: the
//! controllers turn a [`Next`] into a kube-rs `Action`.

use std::time::Duration;

use time::OffsetDateTime;

/// When a controller wants to look at an object again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Next {
    /// When the object changes (its watch wakes the controller).
    #[default]
    AwaitChange,
    /// After this long, changed or not.
    After(Duration),
}

impl Next {
    /// The sooner of two wishes.
    pub fn sooner(self, other: Next) -> Next {
        match (self, other) {
            (Next::After(a), Next::After(b)) => Next::After(a.min(b)),
            (Next::After(a), Next::AwaitChange) | (Next::AwaitChange, Next::After(a)) => {
                Next::After(a)
            }
            (Next::AwaitChange, Next::AwaitChange) => Next::AwaitChange,
        }
    }

    /// Come back once `until` has passed (a little after, so the backoff has surely ended).
    pub fn at(until: OffsetDateTime, now: OffsetDateTime) -> Next {
        let wait = Duration::try_from(until - now).unwrap_or(Duration::ZERO);
        Next::After(wait + Duration::from_millis(50))
    }
}

/// How soon to look again at work that has been running for `running_for` (in this process,
/// or on the node): half that, within bounds. Most work ends by patching its Machine, which
/// wakes the controller anyway; this only bounds how late an end that changes nothing is seen,
/// so a long wait costs a few reconciles, not five a second.
pub fn busy_retry(running_for: Duration) -> Duration {
    (running_for / 2).clamp(BUSY_RETRY_MIN, BUSY_RETRY_MAX)
}

const BUSY_RETRY_MIN: Duration = Duration::from_millis(200);
const BUSY_RETRY_MAX: Duration = Duration::from_secs(30);

/// When the attempt after `failed` failures may run: `base`, doubling per failure, rounded up
/// to a whole second, since the annotation that records it holds whole seconds: truncating
/// would cut up to a second off the backoff.
pub fn retry_at(now: OffsetDateTime, base: Duration, failed: u32) -> OffsetDateTime {
    let factor = 2u32.saturating_pow(failed.saturating_sub(1).min(16));
    let at = now + base.saturating_mul(factor);
    match at.nanosecond() {
        0 => at,
        _ => at.replace_nanosecond(0).unwrap_or(at) + time::Duration::SECOND,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::timestamp::{format_time, parse_time};
    use time::macros::datetime;

    const NOW: OffsetDateTime = datetime!(2026-01-01 12:00 UTC);

    #[test]
    fn running_work_is_looked_at_with_a_growing_backoff_not_a_fixed_spin() {
        // Looking again as `busy_retry` says while work runs for 10 minutes.
        let mut looked = Vec::new();
        let mut elapsed = Duration::ZERO;
        while elapsed < Duration::from_secs(600) {
            let wait = busy_retry(elapsed);
            looked.push(wait);
            elapsed += wait;
        }
        assert!(looked.windows(2).all(|w| w[0] <= w[1]), "{looked:?}");
        assert_eq!(looked[0], Duration::from_millis(200), "a quick first look");
        assert_eq!(*looked.last().unwrap(), BUSY_RETRY_MAX);
        // A fixed 200 ms spin would look 3,000 times.
        assert!(looked.len() < 40, "{} looks: {looked:?}", looked.len());
        let first_minute = looked
            .iter()
            .scan(Duration::ZERO, |t, w| {
                *t += *w;
                Some(*t)
            })
            .take_while(|t| *t <= Duration::from_secs(60))
            .count();
        assert!(
            first_minute < 20,
            "{first_minute} looks in the first minute"
        );
    }

    #[test]
    fn backoff_doubles() {
        let base = Duration::from_secs(10);
        assert_eq!(retry_at(NOW, base, 1) - NOW, time::Duration::seconds(10));
        assert_eq!(retry_at(NOW, base, 2) - NOW, time::Duration::seconds(20));
        assert_eq!(retry_at(NOW, base, 3) - NOW, time::Duration::seconds(40));
        // Recorded in whole seconds, never shorter than asked.
        let between = NOW + time::Duration::milliseconds(600);
        let short = Duration::from_millis(200);
        let at = retry_at(between, short, 1);
        assert_eq!(at, datetime!(2026-01-01 12:00:01 UTC));
        assert_eq!(parse_time(Some(&format_time(at))), Some(at));
        assert!(at - between >= time::Duration::milliseconds(200));
    }

    #[test]
    fn the_sooner_wish_wins() {
        let (short, long) = (
            Next::After(Duration::from_secs(1)),
            Next::After(Duration::from_secs(9)),
        );
        assert_eq!(short.sooner(long), short);
        assert_eq!(Next::AwaitChange.sooner(long), long);
        assert_eq!(
            Next::AwaitChange.sooner(Next::AwaitChange),
            Next::AwaitChange
        );
        assert_eq!(
            Next::at(NOW - time::Duration::SECOND, NOW),
            Next::After(Duration::from_millis(50)),
            "a past time is looked at at once"
        );
    }
}
