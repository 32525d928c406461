//! Checks a session once when it is opened, so a file damaged after it was
//! written (a dropped table, emptied or out-of-range columns, values of the
//! wrong type, missing metadata) is one line naming the table and what is
//! wrong, instead of a raw SQLite error, a wrapped-around count or a
//! misleading header later. Tables other crates own (`intervals`,
//! `bench_samples`) are checked by their readers.

use crate::{Result, StoreError};
use rusqlite::Connection;
use std::path::Path;

/// Columns each table read here must have.
const TABLES: &[(&str, &[&str])] = &[
    ("meta", &["key", "value"]),
    ("events", &["id", "name", "period", "frequency"]),
    (
        "domains",
        &["name", "role", "pid", "status", "ended_at", "detail"],
    ),
    ("stacks", &["id", "frames"]),
    ("samples", SAMPLE_COLUMNS),
    ("bins", &["second", "event", "domain", "context", "samples"]),
    ("lost", &["event", "count"]),
    ("agent_samples", SAMPLE_COLUMNS),
    (
        "domain_scale",
        &[
            "domain",
            "event",
            "host_period",
            "agent_period",
            "agent_samples",
            "agent_lost",
            "factor",
        ],
    ),
];

const SAMPLE_COLUMNS: &[&str] = &[
    "event", "domain", "context", "process", "image", "symbol", "stack", "samples", "period",
];

/// Per table: (condition a bad row meets, what is wrong with such a row).
const SAMPLE_RULES: &[(&str, &str)] = &[
    (
        "typeof(samples) <> 'integer' OR typeof(period) <> 'integer'",
        "a count (samples or period) that is not an integer",
    ),
    ("samples < 0 OR period < 0", "a negative count"),
    (
        "typeof(event) <> 'integer' OR typeof(stack) <> 'integer'",
        "an event or stack id that is not an integer",
    ),
    (
        "typeof(domain) <> 'text' OR typeof(context) <> 'text' OR typeof(process) <> 'text' \
         OR typeof(image) <> 'text' OR typeof(symbol) <> 'text'",
        "a name (domain, context, process, image or symbol) that is not text",
    ),
];

const RULES: &[(&str, &[(&str, &str)])] = &[
    (
        "meta",
        &[(
            "typeof(key) <> 'text' OR typeof(value) <> 'text'",
            "a key or value that is not text",
        )],
    ),
    (
        "events",
        &[
            ("typeof(id) <> 'integer'", "an id that is not an integer"),
            (
                "typeof(name) <> 'text' OR name = ''",
                "no event name",
            ),
            (
                "(period IS NOT NULL AND (typeof(period) <> 'integer' OR period <= 0)) \
                 OR (frequency IS NOT NULL AND (typeof(frequency) <> 'integer' OR frequency <= 0))",
                "a period or frequency that is not a positive integer",
            ),
        ],
    ),
    (
        "domains",
        &[
            (
                "typeof(name) <> 'text' OR typeof(role) <> 'text' OR typeof(status) <> 'text' \
                 OR typeof(detail) <> 'text'",
                "a name, role, status or detail that is not text",
            ),
            (
                "pid IS NOT NULL AND typeof(pid) <> 'integer'",
                "a pid that is not an integer",
            ),
            (
                "ended_at IS NOT NULL AND typeof(ended_at) NOT IN ('real', 'integer')",
                "an end time that is not a number",
            ),
        ],
    ),
    (
        "stacks",
        &[(
            "typeof(id) <> 'integer' OR typeof(frames) <> 'text'",
            "an id that is not an integer or frames that are not text",
        )],
    ),
    ("samples", SAMPLE_RULES),
    ("agent_samples", SAMPLE_RULES),
    (
        "bins",
        &[
            (
                "typeof(second) <> 'integer' OR typeof(event) <> 'integer' OR typeof(samples) <> 'integer'",
                "a second, event or count that is not an integer",
            ),
            (
                "typeof(domain) <> 'text' OR typeof(context) <> 'text'",
                "a domain or context that is not text",
            ),
            ("samples < 0 OR second < 0", "a negative second or count"),
        ],
    ),
    (
        "lost",
        &[(
            "typeof(event) <> 'integer' OR typeof(count) <> 'integer' OR count < 0",
            "an event or count that is not a non-negative integer",
        )],
    ),
    (
        "domain_scale",
        &[
            (
                "typeof(domain) <> 'text' OR typeof(event) <> 'integer' OR typeof(host_period) <> 'integer' \
                 OR typeof(agent_period) <> 'integer' OR typeof(agent_samples) <> 'integer' \
                 OR typeof(agent_lost) <> 'integer'",
                "a domain that is not text or a count that is not an integer",
            ),
            (
                "typeof(factor) NOT IN ('real', 'integer') OR factor < 0",
                "a scale factor that is not a non-negative number",
            ),
        ],
    ),
];

/// Metadata values that must be numbers: (key, must be an integer).
const NUMERIC_META: &[(&str, bool)] = &[
    ("cpus", true),
    ("duration_s", false),
    ("started_at", false),
    ("ended_at", false),
    ("callchain", true),
];

fn damaged(path: &Path, table: &'static str, what: impl Into<String>) -> StoreError {
    StoreError::Damaged {
        path: path.to_path_buf(),
        table,
        what: what.into(),
    }
}

/// Check the tables, types and metadata of an open session.
pub(crate) fn session(conn: &Connection, path: &Path) -> Result<()> {
    let sql = |error| StoreError::Corrupt {
        path: path.to_path_buf(),
        error,
    };
    for (table, cols) in TABLES {
        let mut st = conn
            .prepare("SELECT name FROM pragma_table_info(?1)")
            .map_err(sql)?;
        let have: Vec<String> = st
            .query_map([table], |r| r.get(0))
            .map_err(sql)?
            .collect::<std::result::Result<_, _>>()
            .map_err(sql)?;
        if have.is_empty() {
            return Err(damaged(path, table, "is missing"));
        }
        for c in *cols {
            if !have.iter().any(|h| h == c) {
                return Err(damaged(path, table, format!("has no column '{c}'")));
            }
        }
    }
    for (table, rules) in RULES {
        let cols: Vec<String> = rules
            .iter()
            .map(|(cond, _)| format!("coalesce(sum(CASE WHEN {cond} THEN 1 ELSE 0 END), 0)"))
            .collect();
        let q = format!("SELECT count(*), {} FROM {table}", cols.join(", "));
        let counts: Vec<i64> = conn
            .query_row(&q, [], |r| {
                (0..=rules.len()).map(|i| r.get::<_, i64>(i)).collect()
            })
            .map_err(sql)?;
        for (i, (_, what)) in rules.iter().enumerate() {
            let bad = counts[i + 1];
            if bad > 0 {
                return Err(damaged(
                    path,
                    table,
                    format!("has {bad} of {} rows with {what}", counts[0]),
                ));
            }
        }
    }
    meta(conn, path)?;
    for table in ["samples", "agent_samples"] {
        let table: &'static str = table;
        // Sums the reports compute must fit in 64 bits.
        let (rows, samples, period): (i64, f64, f64) = conn
            .query_row(
                &format!("SELECT count(*), total(samples), total(period) FROM {table}"),
                [],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .map_err(sql)?;
        if samples >= 9.2e18 || period >= 9.2e18 {
            return Err(damaged(
                path,
                table,
                "has counts that add up to more than 2^63 (out of range)",
            ));
        }
        if rows == 0 {
            continue;
        }
        let events: i64 = conn
            .query_row("SELECT count(*) FROM events", [], |r| r.get(0))
            .map_err(sql)?;
        if events == 0 {
            return Err(damaged(
                path,
                "events",
                format!("is empty, but table '{table}' holds {rows} rows"),
            ));
        }
        let orphan: Option<(i64, i64)> = conn
            .query_row(
                &format!(
                    "SELECT event, count(*) FROM {table} WHERE event NOT IN (SELECT id FROM events) \
                     GROUP BY event ORDER BY event LIMIT 1"
                ),
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .map(Some)
            .or_else(|e| match e {
                rusqlite::Error::QueryReturnedNoRows => Ok(None),
                e => Err(e),
            })
            .map_err(sql)?;
        if let Some((ev, n)) = orphan {
            return Err(damaged(
                path,
                table,
                format!("has {n} rows of event {ev}, which table 'events' lacks"),
            ));
        }
    }
    Ok(())
}

fn meta(conn: &Connection, path: &Path) -> Result<()> {
    let get = |key: &str| -> Result<Option<String>> {
        conn.query_row("SELECT value FROM meta WHERE key = ?1", [key], |r| r.get(0))
            .map(Some)
            .or_else(|e| match e {
                rusqlite::Error::QueryReturnedNoRows => Ok(None),
                e => Err(e),
            })
            .map_err(|error| StoreError::Corrupt {
                path: path.to_path_buf(),
                error,
            })
    };
    match get("clean_stop")?.as_deref() {
        Some("0" | "1") => {}
        Some(v) => {
            return Err(damaged(
                path,
                "meta",
                format!("has clean_stop = '{v}', not 0 or 1"),
            ))
        }
        None => {
            return Err(damaged(
                path,
                "meta",
                "has no clean_stop row: the session's metadata was deleted or damaged",
            ))
        }
    }
    for (key, integer) in NUMERIC_META {
        let Some(v) = get(key)? else { continue };
        let ok = if *integer {
            v.parse::<u64>().is_ok()
        } else {
            v.parse::<f64>().is_ok_and(|x| x.is_finite() && x >= 0.0)
        };
        if !ok {
            return Err(damaged(
                path,
                "meta",
                format!(
                    "has {key} = '{v}', not {}",
                    if *integer {
                        "a whole number"
                    } else {
                        "a non-negative number"
                    }
                ),
            ));
        }
    }
    Ok(())
}
