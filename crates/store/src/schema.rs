//! Schema of a session file and its migrations. `PRAGMA user_version` holds
//! the schema version; readers refuse newer versions and migrate older ones.

use rusqlite::Connection;

/// Version written by this build.
pub const SCHEMA_VERSION: i64 = 4;

pub(crate) fn create(conn: &Connection) -> rusqlite::Result<()> {
    conn.execute_batch(
        "
        CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
        CREATE TABLE events(id INTEGER PRIMARY KEY, name TEXT NOT NULL, period INTEGER, frequency INTEGER);
        CREATE TABLE domains(
            name TEXT PRIMARY KEY, role TEXT NOT NULL, pid INTEGER,
            status TEXT NOT NULL DEFAULT 'running', ended_at REAL, detail TEXT NOT NULL DEFAULT '');
        -- One row per distinct stack: the writer interns them in memory
        -- (`SessionWriter::stack_id`), so no index on the text (an index
        -- of long texts in random order cost a recording under exec churn
        -- a tenth of its CPU).
        CREATE TABLE stacks(id INTEGER PRIMARY KEY, frames TEXT NOT NULL);
        -- The host's counts. srcline: `path:line` where DWARF says; second:
        -- whole seconds since the start; cpu: the CPU (-1: not recorded).
        CREATE TABLE samples(
            event INTEGER NOT NULL, domain TEXT NOT NULL, context TEXT NOT NULL,
            process TEXT NOT NULL, image TEXT NOT NULL, symbol TEXT NOT NULL,
            stack INTEGER NOT NULL DEFAULT 0,
            srcline TEXT NOT NULL DEFAULT '', second INTEGER NOT NULL DEFAULT -1, cpu INTEGER NOT NULL DEFAULT -1,
            samples INTEGER NOT NULL, period INTEGER NOT NULL,
            PRIMARY KEY(second, cpu, event, domain, context, process, image, symbol, stack, srcline)) WITHOUT ROWID;
        CREATE TABLE bins(
            second INTEGER NOT NULL, event INTEGER NOT NULL, domain TEXT NOT NULL, context TEXT NOT NULL,
            samples INTEGER NOT NULL,
            PRIMARY KEY(second, event, domain, context)) WITHOUT ROWID;
        CREATE TABLE lost(event INTEGER PRIMARY KEY, count INTEGER NOT NULL);
        -- What active VMs' agents measured inside their guests, raw; second:
        -- when the host received the rows; cpu: the guest CPU (vCPU index).
        CREATE TABLE agent_samples(
            event INTEGER NOT NULL, domain TEXT NOT NULL, context TEXT NOT NULL,
            process TEXT NOT NULL, image TEXT NOT NULL, symbol TEXT NOT NULL,
            stack INTEGER NOT NULL DEFAULT 0,
            srcline TEXT NOT NULL DEFAULT '', second INTEGER NOT NULL DEFAULT -1, cpu INTEGER NOT NULL DEFAULT -1,
            samples INTEGER NOT NULL, period INTEGER NOT NULL,
            PRIMARY KEY(second, cpu, event, domain, context, process, image, symbol, stack, srcline)) WITHOUT ROWID;
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
        -- Build-ids of the files the session's symbols came from (hex).
        CREATE TABLE images(path TEXT PRIMARY KEY, build_id TEXT NOT NULL);
        -- benchmark samples: base units, config hash and manifest per row.
        CREATE TABLE bench_samples(
            experiment TEXT NOT NULL, config_hash TEXT NOT NULL, manifest TEXT NOT NULL,
            point TEXT NOT NULL, sample INTEGER NOT NULL, metric TEXT NOT NULL,
            value REAL NOT NULL, unit TEXT NOT NULL, raw_output TEXT, flagged TEXT);
        ",
    )?;
    conn.execute_batch(DEFERRED_FRAMES)?;
    conn.pragma_update(None, "user_version", SCHEMA_VERSION)?;
    Ok(())
}

/// Host rows a recording stored as numbers, its symbols left for the first
/// read (crate::deferred): the texts they refer to by number (domain and
/// process names, paths, hex build-ids, module and symbol names), then
/// blocks of varints, one of each per flush: frames (what each frame
/// number stands for: a kernel address, a file offset or two names),
/// stacks (their frame numbers, the sampled end first) and rows. Emptied
/// when the first read has written the names into `samples`.
const DEFERRED_FRAMES: &str = "
        CREATE TABLE IF NOT EXISTS deferred_strings(id INTEGER PRIMARY KEY, text TEXT NOT NULL);
        CREATE TABLE IF NOT EXISTS deferred_frames(block INTEGER PRIMARY KEY, data BLOB NOT NULL);
        CREATE TABLE IF NOT EXISTS deferred_stacks(block INTEGER PRIMARY KEY, data BLOB NOT NULL);
        CREATE TABLE IF NOT EXISTS deferred_rows(block INTEGER PRIMARY KEY, data BLOB NOT NULL);";

/// Bring an older session up to [`SCHEMA_VERSION`].
/// 1 → 2: agent rows and per-VM scale factors (coordinated profiling).
/// 2 → 3: source line, second and CPU columns (-1 / empty in old rows:
/// those sessions cannot be sliced by time or CPU); guest kernels named
/// `[guest.kernel.kallsyms]` and guest modules `[guest.NAME]`, apart from
/// the host's `[kernel.kallsyms]` and modules.
/// 3 → 4: host rows whose symbolization a recording deferred (`deferred_*`).
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
    if from < 3 {
        let tx = conn.unchecked_transaction()?;
        for table in ["samples", "agent_samples"] {
            for (column, decl) in [
                ("srcline", "TEXT NOT NULL DEFAULT ''"),
                ("second", "INTEGER NOT NULL DEFAULT -1"),
                ("cpu", "INTEGER NOT NULL DEFAULT -1"),
            ] {
                if !has_column(&tx, table, column)? {
                    tx.execute_batch(&format!("ALTER TABLE {table} ADD COLUMN {column} {decl};"))?;
                }
            }
        }
        // Guest kernels: the host's passive view named them `[guest.kernel]`,
        // agents `[kernel.kallsyms]` and `[module]` like the host's own.
        tx.execute_batch(
            "UPDATE samples SET image = '[guest.kernel.kallsyms]' WHERE image = '[guest.kernel]';
             UPDATE agent_samples SET image = '[guest.kernel.kallsyms]'
               WHERE image IN ('[kernel.kallsyms]', '[guest.kernel]');
             UPDATE agent_samples SET image = '[guest.' || substr(image, 2)
               WHERE context = 'guest-kernel' AND image LIKE '[%]' AND image NOT LIKE '[guest.%'
                 AND image NOT IN ('[anon]', '[unknown]', '[vdso]', '[vsyscall]');",
        )?;
        tx.execute_batch(
            "CREATE TABLE IF NOT EXISTS images(path TEXT PRIMARY KEY, build_id TEXT NOT NULL);",
        )?;
        tx.pragma_update(None, "user_version", 3)?;
        tx.commit()?;
    }
    if from < 4 {
        // Only the writer that resolves deferred frames reads this table,
        // and a version 3 session has none: a reader that cannot write
        // (a read-only file) reads it as it is.
        if conn.execute_batch(DEFERRED_FRAMES).is_ok() {
            conn.pragma_update(None, "user_version", 4)?;
        }
    }
    Ok(())
}

fn has_column(conn: &Connection, table: &str, column: &str) -> rusqlite::Result<bool> {
    let mut st = conn.prepare(&format!("SELECT name FROM pragma_table_info('{table}')"))?;
    let names = st.query_map([], |r| r.get::<_, String>(0))?;
    for n in names {
        if n? == column {
            return Ok(true);
        }
    }
    Ok(false)
}
