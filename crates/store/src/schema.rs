//! Schema of a session file and its migrations. `PRAGMA user_version` holds
//! the schema version; readers refuse newer versions and migrate older ones.

use rusqlite::Connection;

/// Version written by this build.
pub const SCHEMA_VERSION: i64 = 2;

pub(crate) fn create(conn: &Connection) -> rusqlite::Result<()> {
    conn.execute_batch(
        "
        CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
        CREATE TABLE events(id INTEGER PRIMARY KEY, name TEXT NOT NULL, period INTEGER, frequency INTEGER);
        CREATE TABLE domains(
            name TEXT PRIMARY KEY, role TEXT NOT NULL, pid INTEGER,
            status TEXT NOT NULL DEFAULT 'running', ended_at REAL, detail TEXT NOT NULL DEFAULT '');
        CREATE TABLE stacks(id INTEGER PRIMARY KEY, frames TEXT NOT NULL UNIQUE);
        CREATE TABLE samples(
            event INTEGER NOT NULL, domain TEXT NOT NULL, context TEXT NOT NULL,
            process TEXT NOT NULL, image TEXT NOT NULL, symbol TEXT NOT NULL,
            stack INTEGER NOT NULL DEFAULT 0,
            samples INTEGER NOT NULL, period INTEGER NOT NULL,
            PRIMARY KEY(event, domain, context, process, image, symbol, stack)) WITHOUT ROWID;
        CREATE TABLE bins(
            second INTEGER NOT NULL, event INTEGER NOT NULL, domain TEXT NOT NULL, context TEXT NOT NULL,
            samples INTEGER NOT NULL,
            PRIMARY KEY(second, event, domain, context)) WITHOUT ROWID;
        CREATE TABLE lost(event INTEGER PRIMARY KEY, count INTEGER NOT NULL);
        -- What active VMs' agents measured inside their guests, raw.
        CREATE TABLE agent_samples(
            event INTEGER NOT NULL, domain TEXT NOT NULL, context TEXT NOT NULL,
            process TEXT NOT NULL, image TEXT NOT NULL, symbol TEXT NOT NULL,
            stack INTEGER NOT NULL DEFAULT 0,
            samples INTEGER NOT NULL, period INTEGER NOT NULL,
            PRIMARY KEY(event, domain, context, process, image, symbol, stack)) WITHOUT ROWID;
        -- Per active VM and event: guest time the host measured on its vCPU
        -- threads, busy time its agent measured, and their ratio (the scale
        -- applied to the agent's rows in the merged profile).
        CREATE TABLE domain_scale(
            domain TEXT NOT NULL, event INTEGER NOT NULL,
            host_period INTEGER NOT NULL, agent_period INTEGER NOT NULL,
            agent_samples INTEGER NOT NULL, agent_lost INTEGER NOT NULL, factor REAL NOT NULL,
            PRIMARY KEY(domain, event));
        -- vm-stat / account rows: one value per (interval, cpu, domain, vcpu, metric).
        CREATE TABLE intervals(
            kind TEXT NOT NULL, t_start REAL NOT NULL, t_end REAL NOT NULL,
            cpu INTEGER, domain TEXT, vcpu TEXT, metric TEXT NOT NULL, value REAL NOT NULL, unit TEXT NOT NULL);
        -- benchmark samples: base units, config hash and manifest per row.
        CREATE TABLE bench_samples(
            experiment TEXT NOT NULL, config_hash TEXT NOT NULL, manifest TEXT NOT NULL,
            point TEXT NOT NULL, sample INTEGER NOT NULL, metric TEXT NOT NULL,
            value REAL NOT NULL, unit TEXT NOT NULL, raw_output TEXT, flagged TEXT);
        ",
    )?;
    conn.pragma_update(None, "user_version", SCHEMA_VERSION)?;
    Ok(())
}

/// Bring an older session up to [`SCHEMA_VERSION`].
/// 1 → 2: agent rows and per-VM scale factors (coordinated profiling).
pub(crate) fn migrate(conn: &Connection, from: i64) -> rusqlite::Result<()> {
    if from < 2 {
        conn.execute_batch(
            "
            CREATE TABLE IF NOT EXISTS agent_samples(
                event INTEGER NOT NULL, domain TEXT NOT NULL, context TEXT NOT NULL,
                process TEXT NOT NULL, image TEXT NOT NULL, symbol TEXT NOT NULL,
                stack INTEGER NOT NULL DEFAULT 0,
                samples INTEGER NOT NULL, period INTEGER NOT NULL,
                PRIMARY KEY(event, domain, context, process, image, symbol, stack)) WITHOUT ROWID;
            CREATE TABLE IF NOT EXISTS domain_scale(
                domain TEXT NOT NULL, event INTEGER NOT NULL,
                host_period INTEGER NOT NULL, agent_period INTEGER NOT NULL,
                agent_samples INTEGER NOT NULL, agent_lost INTEGER NOT NULL, factor REAL NOT NULL,
                PRIMARY KEY(domain, event));
            ",
        )?;
        conn.pragma_update(None, "user_version", 2)?;
    }
    Ok(())
}
