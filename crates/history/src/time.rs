//! Wall-clock times as users give them and as every history output shows
//! them: `03:05` (today, or yesterday when that is still to come),
//! `yesterday 03:05`, `-15m` (before now; `s`, `m`, `h`, `d`), RFC 3339
//! (`2026-11-28T03:05:00Z`, `2026-11-28 03:05`), in local time unless
//! told UTC. The time zone is the C library's (`TZ`, `/etc/localtime`).

/// Seconds since the epoch now.
pub fn now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// Broken-down time of `t` (UTC or local) and its offset from UTC, seconds.
fn broken_down(t: f64, utc: bool) -> (libc::tm, i64) {
    let secs = t.floor() as libc::time_t;
    // SAFETY: an all-zero `tm` is a valid value; the C library fills it.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    // SAFETY: both pointers are to live values of the right types.
    unsafe {
        if utc {
            libc::gmtime_r(&raw const secs, &raw mut tm);
        } else {
            libc::localtime_r(&raw const secs, &raw mut tm);
        }
    }
    let off = if utc { 0 } else { tm.tm_gmtoff };
    (tm, off)
}

/// Seconds since the epoch of a calendar time (local unless `utc`).
fn to_unix(y: i32, mo: u32, d: u32, h: u32, mi: u32, s: f64, utc: bool) -> Option<f64> {
    // SAFETY: as in `broken_down`.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    tm.tm_year = y - 1900;
    tm.tm_mon = mo as i32 - 1;
    tm.tm_mday = d as i32;
    tm.tm_hour = h as i32;
    tm.tm_min = mi as i32;
    tm.tm_sec = s.floor() as i32;
    tm.tm_isdst = -1;
    // SAFETY: `tm` is a live, initialized value.
    let t = unsafe {
        if utc {
            libc::timegm(&raw mut tm)
        } else {
            libc::mktime(&raw mut tm)
        }
    };
    (t != -1).then(|| t as f64 + s.fract())
}

/// `t` as `2026-11-28 03:05:07` with its offset (`+01:00`, or `Z` in UTC):
/// what outputs show.
pub fn show(t: f64, utc: bool) -> String {
    let (tm, off) = broken_down(t, utc);
    format!(
        "{:04}-{:02}-{:02} {:02}:{:02}:{:02}{}",
        tm.tm_year + 1900,
        tm.tm_mon + 1,
        tm.tm_mday,
        tm.tm_hour,
        tm.tm_min,
        tm.tm_sec,
        offset(off)
    )
}

/// `t` in RFC 3339 with milliseconds (`2026-11-28T03:05:07.250+01:00`):
/// what documents carry.
pub fn rfc3339(t: f64, utc: bool) -> String {
    let (tm, off) = broken_down(t, utc);
    let ms = ((t - t.floor()) * 1000.0).floor() as u32;
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{ms:03}{}",
        tm.tm_year + 1900,
        tm.tm_mon + 1,
        tm.tm_mday,
        tm.tm_hour,
        tm.tm_min,
        tm.tm_sec,
        offset(off)
    )
}

fn offset(off: i64) -> String {
    if off == 0 {
        return "Z".into();
    }
    let sign = if off < 0 { '-' } else { '+' };
    let a = off.abs();
    format!("{sign}{:02}:{:02}", a / 3600, a % 3600 / 60)
}

/// What a time looks like, for error messages.
pub const FORMS: &str =
    "03:05, 03:05:30, yesterday 03:05, -15m (s, m, h, d before now) or RFC 3339 (2026-11-28T03:05:00Z)";

fn num<T: std::str::FromStr>(s: &str) -> Option<T> {
    (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
        .then(|| s.parse().ok())
        .flatten()
}

/// `HH:MM` or `HH:MM:SS[.fff]`.
fn clock(s: &str) -> Option<(u32, u32, f64)> {
    let mut it = s.split(':');
    let h: u32 = num(it.next()?)?;
    let m: u32 = num(it.next()?)?;
    let sec: f64 = match it.next() {
        None => 0.0,
        Some(x) => {
            let (w, f) = x.split_once('.').unwrap_or((x, ""));
            let whole: u32 = num(w)?;
            let frac = if f.is_empty() {
                0.0
            } else {
                format!("0.{}", num::<u64>(f).map(|_| f)?).parse().ok()?
            };
            f64::from(whole) + frac
        }
    };
    if it.next().is_some() || h > 23 || m > 59 || sec >= 61.0 {
        return None;
    }
    Some((h, m, sec))
}

/// Parse one time; `now` is the reference of relative and clock-only
/// forms.
pub fn parse(text: &str, now: f64, utc: bool) -> Result<f64, String> {
    let t = text.trim();
    let bad = || format!("'{t}' is not a time; give {FORMS}");
    if let Some(rel) = t.strip_prefix('-') {
        let (n, unit) = rel.split_at(
            rel.find(|c: char| !c.is_ascii_digit() && c != '.')
                .unwrap_or(rel.len()),
        );
        let v: f64 = n
            .parse()
            .ok()
            .filter(|v: &f64| v.is_finite())
            .ok_or_else(bad)?;
        let k = match unit {
            "" | "s" => 1.0,
            "m" | "min" => 60.0,
            "h" => 3600.0,
            "d" => 86400.0,
            _ => return Err(bad()),
        };
        return Ok(now - v * k);
    }
    let (day_shift, rest) = match t.strip_prefix("yesterday") {
        Some(r) => (1, r.trim()),
        None => (0, t),
    };
    if let Some((h, m, s)) = clock(rest) {
        let (tm, _) = broken_down(now, utc);
        let at = |days: i64| {
            let (tm, _) = broken_down(now - days as f64 * 86400.0, utc);
            to_unix(
                tm.tm_year + 1900,
                tm.tm_mon as u32 + 1,
                tm.tm_mday as u32,
                h,
                m,
                s,
                utc,
            )
        };
        let _ = tm;
        let mut v = at(day_shift).ok_or_else(bad)?;
        // A clock time still to come today means last night's.
        if day_shift == 0 && v > now + 60.0 {
            v = at(1).ok_or_else(bad)?;
        }
        return Ok(v);
    }
    if day_shift != 0 {
        return Err(bad());
    }
    // RFC 3339, or a date and a clock time with a space.
    let (date, rest) = t.split_at(t.find(['T', 't', ' ']).ok_or_else(bad)?);
    let rest = &rest[1..];
    let mut d = date.split('-');
    let (y, mo, da): (i32, u32, u32) = (
        num(d.next().ok_or_else(bad)?).ok_or_else(bad)?,
        num(d.next().ok_or_else(bad)?).ok_or_else(bad)?,
        num(d.next().ok_or_else(bad)?).ok_or_else(bad)?,
    );
    if d.next().is_some() || !(1..=12).contains(&mo) || !(1..=31).contains(&da) {
        return Err(bad());
    }
    let (clock_text, zone): (&str, Option<i64>) = if let Some(c) = rest.strip_suffix(['Z', 'z']) {
        (c, Some(0))
    } else if let Some(i) = rest.rfind(['+', '-']) {
        let (c, z) = rest.split_at(i);
        let sign = if z.starts_with('-') { -1 } else { 1 };
        let (zh, zm) = z[1..].split_once(':').ok_or_else(bad)?;
        let (zh, zm): (i64, i64) = (num(zh).ok_or_else(bad)?, num(zm).ok_or_else(bad)?);
        (c, Some(sign * (zh * 3600 + zm * 60)))
    } else {
        (rest, None)
    };
    let (h, m, s) = clock(clock_text).ok_or_else(bad)?;
    match zone {
        Some(off) => Ok(to_unix(y, mo, da, h, m, s, true).ok_or_else(bad)? - off as f64),
        None => to_unix(y, mo, da, h, m, s, utc).ok_or_else(bad),
    }
}

/// Parse `FROM-TO` (`03:05-03:15`, `-15m--5m`, `yesterday 23:50-00:10`):
/// the first `-` that leaves two times. A `TO` earlier than `FROM` by
/// clock only (`23:50-00:10`) is the next day's.
pub fn parse_range(text: &str, now: f64, utc: bool) -> Result<(f64, f64), String> {
    let t = text.trim();
    for (i, _) in t.match_indices('-').filter(|(i, _)| *i > 0) {
        let (a, b) = (&t[..i], &t[i + 1..]);
        if let (Ok(x), Ok(mut y)) = (parse(a, now, utc), parse(b, now, utc)) {
            if y < x && clock(b.trim()).is_some() {
                y += 86400.0;
            }
            if y <= x {
                return Err(format!(
                    "'{t}': the end ({}) is not after the start ({})",
                    show(y, utc),
                    show(x, utc)
                ));
            }
            return Ok((x, y));
        }
    }
    Err(format!(
        "'{t}' is not a time range; give FROM-TO with each side one of {FORMS}"
    ))
}

/// How long until the wall clock is next at a whole multiple of `every`
/// (so that intervals of several measurers, `top` and `serve --history`,
/// cover the same seconds).
pub fn until_next_tick(every: std::time::Duration) -> std::time::Duration {
    let e = every.as_secs_f64().max(1e-3);
    let now = now();
    let next = ((now / e).floor() + 1.0) * e;
    std::time::Duration::from_secs_f64((next - now).max(0.0))
}
