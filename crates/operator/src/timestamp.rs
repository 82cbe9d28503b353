//! Times as the annotations hold them: RFC 3339 in whole seconds, UTC.

use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

/// Reads an annotation's time; `None` when absent or malformed (a malformed time is treated as
/// missing, never as an error: a person may have edited it).
pub fn parse_time(value: Option<&str>) -> Option<OffsetDateTime> {
    OffsetDateTime::parse(value?, &Rfc3339).ok()
}

/// Writes a time for an annotation, cut to the whole second.
pub fn format_time(t: OffsetDateTime) -> String {
    t.replace_nanosecond(0)
        .unwrap_or(t)
        .format(&Rfc3339)
        .unwrap_or_else(|_| t.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use time::macros::datetime;

    #[test]
    fn times_round_trip_in_whole_seconds() {
        let t = datetime!(2026-01-01 12:00:01.600 UTC);
        assert_eq!(format_time(t), "2026-01-01T12:00:01Z");
        assert_eq!(
            parse_time(Some(&format_time(t))),
            Some(datetime!(2026-01-01 12:00:01 UTC))
        );
        assert_eq!(parse_time(Some("soon")), None);
        assert_eq!(parse_time(None), None);
    }
}
