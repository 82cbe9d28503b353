//! When a certificate is due for rotation.

use std::time::Duration;

use time::OffsetDateTime;

/// How early before expiry a certificate is replaced.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RotationPolicy {
    /// Rotate this long before `notAfter` (cert-manager's `renewBefore`).
    Before(Duration),
    /// Rotate once this fraction of the lifetime has passed (library-go refreshes at 0.8).
    /// Always within `(0, 1]`; build it with [`RotationPolicy::fraction`].
    Fraction(f64),
}

/// A fraction outside `(0, 1]`.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("rotation fraction {0} is out of range; expected a number greater than 0 and at most 1")]
pub struct FractionOutOfRange(pub f64);

impl RotationPolicy {
    pub fn fraction(fraction: f64) -> Result<Self, FractionOutOfRange> {
        if fraction > 0.0 && fraction <= 1.0 {
            Ok(RotationPolicy::Fraction(fraction))
        } else {
            Err(FractionOutOfRange(fraction))
        }
    }

    /// The moment a certificate valid from `not_before` to `not_after` is due. Never before
    /// `not_before` and never after `not_after`.
    pub fn due_at(&self, not_before: OffsetDateTime, not_after: OffsetDateTime) -> OffsetDateTime {
        let lifetime = (not_after - not_before).max(time::Duration::ZERO);
        let due = match *self {
            RotationPolicy::Before(before) => {
                let before = time::Duration::try_from(before).unwrap_or(time::Duration::MAX);
                not_after.checked_sub(before).unwrap_or(not_before)
            }
            RotationPolicy::Fraction(fraction) => not_before + lifetime * fraction.clamp(0.0, 1.0),
        };
        due.clamp(not_before, not_after.max(not_before))
    }

    /// Whether the certificate is due at `now`.
    pub fn is_due(
        &self,
        not_before: OffsetDateTime,
        not_after: OffsetDateTime,
        now: OffsetDateTime,
    ) -> bool {
        now >= self.due_at(not_before, not_after)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use time::macros::datetime;

    const DAY: Duration = Duration::from_secs(86_400);

    #[test]
    fn before_counts_back_from_expiry() {
        let policy = RotationPolicy::Before(30 * DAY);
        let due = policy.due_at(
            datetime!(2025-01-01 0:00 UTC),
            datetime!(2026-01-01 0:00 UTC),
        );
        assert_eq!(due, datetime!(2025-12-02 0:00 UTC));
        assert!(!policy.is_due(
            datetime!(2025-01-01 0:00 UTC),
            datetime!(2026-01-01 0:00 UTC),
            datetime!(2025-12-01 23:59 UTC)
        ));
        assert!(policy.is_due(
            datetime!(2025-01-01 0:00 UTC),
            datetime!(2026-01-01 0:00 UTC),
            datetime!(2025-12-02 0:00 UTC)
        ));
    }

    #[test]
    fn before_longer_than_lifetime_is_due_at_once() {
        let policy = RotationPolicy::Before(400 * DAY);
        let start = datetime!(2025-01-01 0:00 UTC);
        assert_eq!(policy.due_at(start, datetime!(2026-01-01 0:00 UTC)), start);
        let huge = RotationPolicy::Before(Duration::MAX);
        assert_eq!(huge.due_at(start, datetime!(2026-01-01 0:00 UTC)), start);
    }

    #[test]
    fn fraction_of_lifetime() {
        let policy = RotationPolicy::fraction(0.8).unwrap();
        let due = policy.due_at(
            datetime!(2025-01-01 0:00 UTC),
            datetime!(2025-01-11 0:00 UTC),
        );
        assert_eq!(due, datetime!(2025-01-09 0:00 UTC));
        assert!(RotationPolicy::fraction(0.0).is_err());
        assert!(RotationPolicy::fraction(1.5).is_err());
        assert!(RotationPolicy::fraction(f64::NAN).is_err());
    }

    proptest! {
        #[test]
        fn due_is_always_inside_the_validity(
            start in 0i64..4_000_000_000, lifetime in 0i64..400_000_000,
            before in 0u64..500_000_000, fraction in 0.001f64..=1.0,
        ) {
            let not_before = OffsetDateTime::from_unix_timestamp(start).unwrap();
            let not_after = not_before + time::Duration::seconds(lifetime);
            for policy in [RotationPolicy::Before(Duration::from_secs(before)),
                           RotationPolicy::fraction(fraction).unwrap()] {
                let due = policy.due_at(not_before, not_after);
                prop_assert!(due >= not_before && due <= not_after);
            }
        }
    }
}
