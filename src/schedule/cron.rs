//! The tick arithmetic: a cron expression read in an IANA time zone, as
//! UTC instants (DST gaps and folds, nicknames, the 5- and 6-field forms).

use super::*;
use crate::clock::ms_to_datetime;
use crate::engine::types::MAX_TIMESTAMP_MS;
use crate::error::{Error, Result};
use chrono::{LocalResult, Offset, TimeZone};
use chrono_tz::Tz;
use croner::parser::{CronParser, Seconds, Year};
use croner::Cron;

/// Offsets are probed this far apart when looking for a time zone
/// transition between two instants (transitions are months apart).
const PROBE_STEP_MS: i64 = 3_600_000;

/// A parsed expression in its time zone: the tick set, as UTC milliseconds.
#[derive(Debug, Clone)]
pub(crate) struct Ticks {
    cron: Cron,
    tz: Tz,
    /// The hour field matches every hour: real-time DST rules.
    every_hour: bool,
    /// Ticks in this window (inclusive, ms) are not ticks: they already
    /// fired before a backward step of the clock.
    hole: Option<(i64, i64)>,
}

impl Ticks {
    /// Parses `expression` in `zone`.
    ///
    /// # Errors
    /// [`Error::InvalidSchedule`], [`Error::UnknownTimeZone`].
    pub(crate) fn new(expression: &str, zone: &str) -> Result<Ticks> {
        let invalid = |reason: String| Error::InvalidSchedule {
            expression: expression.to_owned(),
            reason,
        };
        let normalized = normalize_cron(expression).map_err(invalid)?;
        let cron = CronParser::builder()
            .seconds(Seconds::Optional)
            .year(Year::Disallowed)
            .build()
            .parse(&normalized)
            .map_err(|e| invalid(e.to_string()))?;
        let tz: Tz = zone.parse().map_err(|_| Error::UnknownTimeZone {
            name: zone.to_owned(),
        })?;
        let every_hour = (0..24).all(|h| cron.pattern.hour_match(h).unwrap_or(false));
        Ok(Ticks {
            cron,
            tz,
            every_hour,
            hole: None,
        })
    }

    /// The same tick set without the ticks in `hole` (inclusive).
    pub(crate) fn without(mut self, hole: Option<(i64, i64)>) -> Ticks {
        self.hole = hole;
        self
    }

    /// As [`Ticks::new`], and refuses an expression with no tick at or
    /// after `now_ms` (30 February).
    pub(crate) fn new_firing(expression: &str, zone: &str, now_ms: i64) -> Result<Ticks> {
        let ticks = Ticks::new(expression, zone)?;
        if ticks.at_or_after(now_ms).is_none() {
            return Err(Error::InvalidSchedule {
                expression: expression.to_owned(),
                reason: "it never fires: no date matches all of its fields (like 30 February)"
                    .into(),
            });
        }
        Ok(ticks)
    }

    /// UTC offset in force at instant `at_ms`, in ms.
    pub(crate) fn offset_ms(&self, at_ms: i64) -> i64 {
        let utc = ms_to_datetime(at_ms).naive_utc();
        i64::from(
            self.tz
                .offset_from_utc_datetime(&utc)
                .fix()
                .local_minus_utc(),
        ) * 1000
    }

    /// The first tick at or after `from_ms`.
    pub(crate) fn at_or_after(&self, from_ms: i64) -> Option<i64> {
        self.next_after(from_ms.saturating_sub(1))
    }

    /// The first tick strictly after `after_ms`.
    pub(crate) fn next_after(&self, after_ms: i64) -> Option<i64> {
        self.next_after_until(after_ms, MAX_TIMESTAMP_MS)
    }

    /// The first tick strictly after `after_ms`, if it is at most `limit_ms`.
    ///
    /// Walks the time line in spans of constant UTC offset: within one, the
    /// parser's next wall-clock match gives the tick; where a span ends
    /// before that match, the transition decides (a gap tick for a
    /// wall-clock time the gap swallowed, otherwise go on in the next span).
    pub(crate) fn next_after_until(&self, after_ms: i64, limit_ms: i64) -> Option<i64> {
        let tick = self.next_after_until_all(after_ms, limit_ms)?;
        match self.hole {
            Some((from, until)) if (from..=until).contains(&tick) => {
                self.next_after_until_all(until, limit_ms)
            }
            _ => Some(tick),
        }
    }

    /// [`Ticks::next_after_until`] ignoring the hole.
    fn next_after_until_all(&self, after_ms: i64, limit_ms: i64) -> Option<i64> {
        let limit_ms = limit_ms.min(MAX_TIMESTAMP_MS);
        let mut lo = after_ms.max(-1);
        // The offset in force at `lo`: a transition at lo + 1 is then seen
        // as a change, so a gap ending exactly there still gets its tick.
        let mut off = self.offset_ms(lo);
        loop {
            if lo >= limit_ms {
                return None;
            }
            // The parser works in whole seconds and `false` means "strictly
            // after", so start it from the wall-clock second holding lo.
            let local_second = (lo + off).div_euclid(1000) * 1000;
            let start = ms_to_datetime(local_second).naive_utc();
            let wall = self.cron.find_next_occurrence(&start, false).ok()?;
            let wall_ms = wall.and_utc().timestamp_millis();
            let candidate = wall_ms - off;
            match self.first_offset_change(lo + 1, candidate.min(limit_ms), off) {
                None if candidate > limit_ms => return None,
                None => {
                    // No transition up to the candidate: it is a real
                    // instant showing `wall`. A fixed-time expression fires
                    // a repeated wall-clock time only at its first instant.
                    if !self.every_hour {
                        if let LocalResult::Ambiguous(first, _) = self.tz.from_local_datetime(&wall)
                        {
                            if first.timestamp_millis() != candidate {
                                lo = candidate;
                                continue;
                            }
                        }
                    }
                    return Some(candidate);
                }
                Some(change) => {
                    let new_off = self.offset_ms(change);
                    // Wall-clock times in [change + off, change + new_off)
                    // do not exist; `wall` is the first match at or after
                    // change + off.
                    if new_off > off && wall_ms < change + new_off && !self.every_hour {
                        return Some(change);
                    }
                    lo = change - 1;
                    off = new_off;
                }
            }
        }
    }

    /// The first instant in `[from_ms, to_ms]` whose offset is not `off`.
    fn first_offset_change(&self, from_ms: i64, to_ms: i64, off: i64) -> Option<i64> {
        if self.offset_ms(from_ms) != off {
            return Some(from_ms);
        }
        let mut probe = from_ms;
        while probe < to_ms {
            let next = probe.saturating_add(PROBE_STEP_MS).min(to_ms);
            if self.offset_ms(next) != off {
                // Offsets differ somewhere in (probe, next]: bisect.
                let (mut same, mut changed) = (probe, next);
                while changed - same > 1 {
                    let mid = same + (changed - same) / 2;
                    if self.offset_ms(mid) == off {
                        same = mid;
                    } else {
                        changed = mid;
                    }
                }
                return Some(changed);
            }
            probe = next;
        }
        None
    }

    /// The latest tick at or before `to_ms`, given that `from_ms` is a tick
    /// at or before it: a bisection over instants, about 40 steps for years.
    pub(crate) fn latest_at_or_before(&self, from_ms: i64, to_ms: i64) -> i64 {
        // Invariant: `good` is a tick <= to_ms; no tick in [bad, to_ms].
        let (mut good, mut bad) = (from_ms, to_ms.saturating_add(1));
        while bad - good > 1 {
            let mid = good + (bad - good) / 2;
            match self.next_after_until(mid - 1, to_ms) {
                Some(tick) => good = tick,
                None => bad = mid,
            }
        }
        good
    }

    /// The tick at `at_ms` as a [`Tick`].
    pub(crate) fn tick(&self, at_ms: i64) -> Tick {
        let at = ms_to_datetime(at_ms);
        Tick {
            at,
            local: at.with_timezone(&self.tz).fixed_offset(),
        }
    }
}

/// Name, minimum, maximum and maximum for a step from a single value, of
/// each field of a 6-field expression (a 5-field one has no seconds).
/// Day-of-week accepts 7 for Sunday, but `a/n` runs to 6 as in Quartz,
/// croniter and Kubernetes, so that `1/2` does not include Sunday twice over.
const CRON_FIELDS: [(&str, u32, u32, u32); 6] = [
    ("second", 0, 59, 59),
    ("minute", 0, 59, 59),
    ("hour", 0, 23, 23),
    ("day-of-month", 1, 31, 31),
    ("month", 1, 12, 12),
    ("day-of-week", 0, 7, 6),
];

const NICKNAMES: [&str; 6] = [
    "@yearly",
    "@annually",
    "@monthly",
    "@weekly",
    "@daily",
    "@hourly",
];

/// Rewrites what croner refuses but other tools accept into croner's
/// syntax, and gives out-of-range values a message naming the field:
/// `@midnight` becomes `@daily`, and a step from a single value `a/n`
/// becomes `a-max/n` (croner's own "sloppy" mode would also accept `/n`
/// and run day-of-week steps to 7). Everything else is left to croner.
fn normalize_cron(expression: &str) -> std::result::Result<String, String> {
    let trimmed = expression.trim();
    if let Some(word) = trimmed
        .split_whitespace()
        .next()
        .filter(|w| w.starts_with('@'))
    {
        if word.eq_ignore_ascii_case("@midnight") && trimmed.len() == word.len() {
            return Ok("@daily".to_owned());
        }
        if NICKNAMES.iter().any(|n| n.eq_ignore_ascii_case(word)) {
            return Ok(trimmed.to_owned());
        }
        return Err(format!(
            "{word} is not a schedule tickler knows; use one of {}, @midnight, or cron fields",
            NICKNAMES.join(", ")
        ));
    }
    let fields: Vec<&str> = trimmed.split_whitespace().collect();
    let specs = match fields.len() {
        5 => &CRON_FIELDS[1..],
        6 => &CRON_FIELDS[..],
        // croner says how many fields it wants.
        _ => return Ok(trimmed.to_owned()),
    };
    let mut out = Vec::with_capacity(fields.len());
    for (field, spec) in fields.iter().zip(specs) {
        let parts = field
            .split(',')
            .map(|part| normalize_part(part, *spec))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        out.push(parts.join(","));
    }
    Ok(out.join(" "))
}

/// One comma-separated part of a field; see [`normalize_cron`].
fn normalize_part(
    part: &str,
    (name, min, max, step_max): (&str, u32, u32, u32),
) -> std::result::Result<String, String> {
    let in_range = |value: &str, top: u32, note: &str| -> std::result::Result<(), String> {
        match value.parse::<u32>() {
            Ok(v) if (min..=top).contains(&v) => Ok(()),
            Ok(v) => Err(format!("{name} {v} is out of range {min}-{top}{note}")),
            // Names and modifiers (L, W, #) are croner's to check.
            Err(_) => Ok(()),
        }
    };
    let sunday = if name == "day-of-week" {
        " (0 and 7 are Sunday)"
    } else {
        ""
    };
    let Some((base, step)) = part.split_once('/') else {
        for bound in part.split('-') {
            in_range(bound, max, sunday)?;
        }
        return Ok(part.to_owned());
    };
    let n = match step.parse::<u32>() {
        Ok(0) => return Err(format!("{name} step in {part:?} is 0; a step is 1 or more")),
        Ok(n) => n,
        Err(_) => {
            return Err(format!(
                "{name} step in {part:?} is not a number; write a step as start/n, e.g. \"{min}/5\""
            ))
        }
    };
    if base.is_empty() {
        return Err(format!(
            "{name} {part:?} has a step but no start: write \"*/{n}\" for every {n} from {min}, or \"{min}/{n}\" to say where it starts"
        ));
    }
    if base == "*" || base.contains('-') {
        for bound in base.split('-').filter(|b| *b != "*") {
            in_range(bound, max, sunday)?;
        }
        return Ok(part.to_owned());
    }
    let named = base.chars().all(|c| c.is_ascii_alphabetic());
    let numeric = base.chars().all(|c| c.is_ascii_digit());
    if numeric {
        let for_step = if step_max < max { " for a step" } else { "" };
        in_range(base, step_max, for_step)?;
        // Kubernetes CronJob, Quartz and croniter read a/n as a-max/n.
        return Ok(format!("{base}-{step_max}/{n}"));
    }
    if named && matches!(name, "month" | "day-of-week") {
        return Ok(format!("{base}-{step_max}/{n}"));
    }
    Err(format!(
        "{name} {base:?} in {part:?} is not a number{}",
        if named {
            " (names are for month and day-of-week)"
        } else {
            ""
        }
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ms_to_datetime;
    use chrono::TimeZone;

    fn ms(y: i32, mo: u32, d: u32, h: u32, mi: u32, s: u32) -> i64 {
        Utc.with_ymd_and_hms(y, mo, d, h, mi, s)
            .unwrap()
            .timestamp_millis()
    }

    fn walk(t: &Ticks, from: i64, n: usize) -> Vec<i64> {
        let mut out = Vec::new();
        let mut cur = t.at_or_after(from);
        while let Some(x) = cur {
            if out.len() == n {
                break;
            }
            out.push(x);
            cur = t.next_after(x);
        }
        out
    }

    #[test]
    fn utc_every_minute() {
        let t = Ticks::new("* * * * *", "UTC").unwrap();
        let from = ms(2026, 1, 1, 0, 0, 30);
        assert_eq!(
            walk(&t, from, 2),
            vec![ms(2026, 1, 1, 0, 1, 0), ms(2026, 1, 1, 0, 2, 0)]
        );
        assert_eq!(
            t.at_or_after(ms(2026, 1, 1, 0, 1, 0)),
            Some(ms(2026, 1, 1, 0, 1, 0))
        );
        assert_eq!(
            t.next_after(ms(2026, 1, 1, 0, 1, 0)),
            Some(ms(2026, 1, 1, 0, 2, 0))
        );
    }

    #[test]
    fn a_gap_tick_is_found_from_just_before_and_at_it() {
        let t = Ticks::new("30 2 * * *", "America/New_York").unwrap();
        let gap_end = ms(2026, 3, 8, 7, 0, 0);
        assert_eq!(t.at_or_after(gap_end), Some(gap_end));
        assert_eq!(t.next_after(gap_end - 1), Some(gap_end));
        assert_eq!(t.next_after(gap_end), Some(ms(2026, 3, 9, 6, 30, 0)));
    }

    #[test]
    fn latest_at_or_before_finds_the_last_tick() {
        let t = Ticks::new("0 3 * * *", "Europe/Berlin").unwrap();
        let first = t.at_or_after(ms(2023, 1, 1, 0, 0, 0)).unwrap();
        let now = ms(2026, 6, 15, 12, 0, 0);
        // 03:00 CEST = 01:00 UTC.
        assert_eq!(t.latest_at_or_before(first, now), ms(2026, 6, 15, 1, 0, 0));
    }

    #[test]
    fn plan_fire_all_takes_the_oldest() {
        let t = Ticks::new("0 * * * *", "UTC").unwrap();
        let first = ms(2026, 1, 1, 0, 0, 0);
        let now = ms(2026, 1, 2, 0, 0, 30);
        let p = plan(&t, first, now, MisfirePolicy::FireAll { max: 3 }, 60_000);
        assert_eq!(
            p.ticks,
            vec![
                first,
                first + 3_600_000,
                first + 7_200_000,
                ms(2026, 1, 2, 0, 0, 0)
            ]
        );
        assert_eq!(p.next, Some(ms(2026, 1, 2, 1, 0, 0)));
    }

    /// The tick set by definition, one minute at a time: a wall-clock
    /// match at its (first, unless every-hour) instant, or the first instant
    /// after a gap that swallowed a match (fixed-time expressions only).
    fn brute_force(t: &Ticks, from: i64, to: i64) -> Vec<i64> {
        let mut out = Vec::new();
        let mut s = from.div_euclid(60_000) * 60_000;
        while s <= to {
            let off = t.offset_ms(s);
            let wall = ms_to_datetime(s + off).naive_utc();
            let mut tick = t.cron.is_time_matching(&wall).unwrap()
                && (t.every_hour
                    || match t.tz.from_local_datetime(&wall) {
                        LocalResult::Ambiguous(first, _) => first.timestamp_millis() == s,
                        _ => true,
                    });
            let before = t.offset_ms(s - 1);
            if !tick && !t.every_hour && before < off {
                let mut gap = s + before;
                while gap < s + off {
                    if t.cron
                        .is_time_matching(&ms_to_datetime(gap).naive_utc())
                        .unwrap()
                    {
                        tick = true;
                    }
                    gap += 60_000;
                }
            }
            if tick && s >= from {
                out.push(s);
            }
            s += 60_000;
        }
        out
    }

    fn field(
        options: &'static [&'static str],
    ) -> impl proptest::strategy::Strategy<Value = &'static str> {
        proptest::sample::select(options)
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]

        /// The walk over spans of constant offset finds exactly the ticks
        /// of the definition, around real DST transitions.
        #[test]
        fn walk_matches_the_definition(
            minute in field(&["*", "*/15", "0", "30", "0,30", "10-50/20", "59"]),
            hour in field(&["*", "1", "2", "3", "*/2", "1-3", "0,12", "22-23"]),
            dom in field(&["*", "*", "1", "L", "25-31"]),
            dow in field(&["*", "*", "0", "SUN", "1-5", "6"]),
            zone in field(&["America/New_York", "Europe/Berlin", "Australia/Lord_Howe", "UTC", "America/Havana"]),
            day in field(&["2026-03-08", "2026-03-29", "2026-10-25", "2026-11-01", "2026-04-05", "2026-10-04", "2026-03-15"]),
            shift_minutes in -1500i64..1500,
        ) {
            let expression = format!("{minute} {hour} {dom} * {dow}");
            let t = Ticks::new(&expression, zone).unwrap();
            let base = chrono::NaiveDate::parse_from_str(day, "%Y-%m-%d").unwrap()
                .and_hms_opt(0, 0, 0).unwrap().and_utc().timestamp_millis();
            let from = base + shift_minutes * 60_000 - 86_400_000;
            let to = from + 2 * 86_400_000;
            let expected = brute_force(&t, from, to);
            let mut got = Vec::new();
            let mut cur = t.at_or_after(from);
            while let Some(x) = cur {
                if x > to {
                    break;
                }
                got.push(x);
                cur = t.next_after(x);
            }
            for &tick in &expected {
                // Each tick is found from just before it and from itself.
                proptest::prop_assert_eq!(t.at_or_after(tick), Some(tick));
                proptest::prop_assert_eq!(t.next_after(tick - 1), Some(tick));
            }
            proptest::prop_assert_eq!(got, expected, "{} in {}", expression, zone);
        }
    }
}
