//! The journal's schema, its version and the migrations that bring an older
//! journal up to date.
//!
//! The version lives in SQLite's `PRAGMA user_version`:
//!
//! | version | layout |
//! | --- | --- |
//! | 0 | a new, empty file, or a journal written before versioning: any subset of the tables and columns below |
//! | 1 | sessions without `language` (every session ran Python), no `network_denials` |
//! | 2 | `sessions.language` names the runtime a session's kernels run (`python`, `r`; NULL in rows of older journals: Python), no `network_denials` |
//! | 3 | `network_denials` holds the egress proxy's refusals per cell; no `credential_nonces` |
//! | 4 | `credential_nonces` holds the nonces of remote agents' single-use credentials, burned at first use; kernels without lineage or `placement`, no `sessions.settings`, no `checkpoints` |
//! | 5 | `kernels.parent_session`, `kernels.parent_generation` and `kernels.fork_point` record the session, generation and `execution_count` a forked kernel was forked from (NULL for a kernel that was not); no `kernels.placement`, no `sessions.settings`, no `checkpoints` |
//! | 6 | (the number of another layout; a journal at it migrates as any earlier one: whatever is missing is added) |
//! | 7 | `kernels.placement` says where each generation ran (the JSON of a [`KernelPlacement`](cellhost_kernel::KernelPlacement); NULL for a local kernel); no `sessions.settings`, no `checkpoints` |
//! | 8 | `sessions.settings` holds the session's own limits and network policy (JSON, [`crate::journal::SessionSettings`]; NULL: the configured ones), which `restore` and a restarted host give its next kernel; no `checkpoints` |
//! | 9 | the tables and columns of [`SCHEMA`]: `checkpoints` holds each session's latest namespace checkpoint (its file, execution_count, time, what was saved and lost) and whether the session is paused |
//!
//! Opening a journal runs every migration from its version to
//! [`SCHEMA_VERSION`] in one transaction, so a journal is either fully
//! migrated or left as it was. A journal of a newer version than this build
//! knows is refused ([`SchemaError::Newer`]), never written.
//!
//! Adding a column: append it to [`SCHEMA`] *and* to [`COLUMNS`] (with a
//! default, so `ALTER TABLE ... ADD COLUMN` can fill old rows), bump
//! [`SCHEMA_VERSION`] and add a row to the table above; the unit tests open
//! a journal of every earlier layout.

use rusqlite::{Connection, params};

/// The schema version this build writes.
pub const SCHEMA_VERSION: i64 = 9;

/// The current layout (`CREATE ... IF NOT EXISTS`, so it also fills in
/// tables an older journal lacks).
pub const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS sessions (
  owner TEXT NOT NULL, session TEXT NOT NULL,
  created_ms INTEGER NOT NULL, last_used_ms INTEGER NOT NULL,
  python TEXT, cwd TEXT, tools TEXT, profile TEXT, language TEXT, settings TEXT,
  PRIMARY KEY (owner, session));
CREATE TABLE IF NOT EXISTS kernels (
  owner TEXT NOT NULL, session TEXT NOT NULL, generation INTEGER NOT NULL,
  pid INTEGER, started_ms INTEGER NOT NULL, ended_ms INTEGER, end_reason TEXT,
  parent_session TEXT, parent_generation INTEGER, fork_point INTEGER,
  placement TEXT,
  PRIMARY KEY (owner, session, generation));
CREATE TABLE IF NOT EXISTS cells (
  id TEXT PRIMARY KEY, owner TEXT NOT NULL, session TEXT NOT NULL,
  generation INTEGER NOT NULL, execution_count INTEGER NOT NULL DEFAULT 0,
  code TEXT NOT NULL, status TEXT NOT NULL,
  started_ms INTEGER NOT NULL, ended_ms INTEGER, duration_ms INTEGER,
  stdout_head TEXT NOT NULL DEFAULT '', stdout_tail TEXT NOT NULL DEFAULT '',
  stderr_head TEXT NOT NULL DEFAULT '', stderr_tail TEXT NOT NULL DEFAULT '',
  display_files TEXT NOT NULL DEFAULT '[]', tool_calls TEXT NOT NULL DEFAULT '[]',
  origin TEXT NOT NULL DEFAULT '', context TEXT,
  files_read TEXT NOT NULL DEFAULT '[]', files_written TEXT NOT NULL DEFAULT '[]',
  files_truncated INTEGER NOT NULL DEFAULT 0, error TEXT);
CREATE INDEX IF NOT EXISTS cells_by_session ON cells (owner, session, started_ms);
CREATE TABLE IF NOT EXISTS tool_calls (
  cell_id TEXT NOT NULL, seq INTEGER NOT NULL, tool TEXT NOT NULL,
  args_preview TEXT NOT NULL, duration_ms INTEGER NOT NULL, outcome TEXT NOT NULL,
  error TEXT, PRIMARY KEY (cell_id, seq));
CREATE TABLE IF NOT EXISTS network_denials (
  cell_id TEXT NOT NULL, seq INTEGER NOT NULL, host TEXT NOT NULL,
  port INTEGER NOT NULL, reason TEXT NOT NULL, sni TEXT,
  PRIMARY KEY (cell_id, seq));
CREATE TABLE IF NOT EXISTS credential_nonces (
  nonce TEXT PRIMARY KEY, used_ms INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS checkpoints (
  owner TEXT NOT NULL, session TEXT NOT NULL, mode TEXT NOT NULL,
  generation INTEGER NOT NULL, execution_count INTEGER NOT NULL,
  taken_ms INTEGER NOT NULL, path TEXT NOT NULL, bytes INTEGER NOT NULL,
  saved TEXT NOT NULL DEFAULT '[]', lost TEXT NOT NULL DEFAULT '[]',
  paused_ms INTEGER,
  PRIMARY KEY (owner, session));
";

/// Every column of [`SCHEMA`] as `(table, column, declaration for ALTER
/// TABLE ADD COLUMN)`: the declaration carries a default wherever the
/// column is `NOT NULL`, so rows of an older journal get a value.
pub const COLUMNS: &[(&str, &str, &str)] = &[
    ("sessions", "owner", "TEXT NOT NULL DEFAULT ''"),
    ("sessions", "session", "TEXT NOT NULL DEFAULT ''"),
    ("sessions", "created_ms", "INTEGER NOT NULL DEFAULT 0"),
    ("sessions", "last_used_ms", "INTEGER NOT NULL DEFAULT 0"),
    ("sessions", "python", "TEXT"),
    ("sessions", "cwd", "TEXT"),
    ("sessions", "tools", "TEXT"),
    ("sessions", "profile", "TEXT"),
    ("sessions", "language", "TEXT"),
    ("sessions", "settings", "TEXT"),
    ("kernels", "owner", "TEXT NOT NULL DEFAULT ''"),
    ("kernels", "session", "TEXT NOT NULL DEFAULT ''"),
    ("kernels", "generation", "INTEGER NOT NULL DEFAULT 0"),
    ("kernels", "pid", "INTEGER"),
    ("kernels", "started_ms", "INTEGER NOT NULL DEFAULT 0"),
    ("kernels", "ended_ms", "INTEGER"),
    ("kernels", "end_reason", "TEXT"),
    ("kernels", "parent_session", "TEXT"),
    ("kernels", "parent_generation", "INTEGER"),
    ("kernels", "fork_point", "INTEGER"),
    ("kernels", "placement", "TEXT"),
    ("cells", "id", "TEXT"),
    ("cells", "owner", "TEXT NOT NULL DEFAULT ''"),
    ("cells", "session", "TEXT NOT NULL DEFAULT ''"),
    ("cells", "generation", "INTEGER NOT NULL DEFAULT 0"),
    ("cells", "execution_count", "INTEGER NOT NULL DEFAULT 0"),
    ("cells", "code", "TEXT NOT NULL DEFAULT ''"),
    ("cells", "status", "TEXT NOT NULL DEFAULT 'lost'"),
    ("cells", "started_ms", "INTEGER NOT NULL DEFAULT 0"),
    ("cells", "ended_ms", "INTEGER"),
    ("cells", "duration_ms", "INTEGER"),
    ("cells", "stdout_head", "TEXT NOT NULL DEFAULT ''"),
    ("cells", "stdout_tail", "TEXT NOT NULL DEFAULT ''"),
    ("cells", "stderr_head", "TEXT NOT NULL DEFAULT ''"),
    ("cells", "stderr_tail", "TEXT NOT NULL DEFAULT ''"),
    ("cells", "display_files", "TEXT NOT NULL DEFAULT '[]'"),
    ("cells", "tool_calls", "TEXT NOT NULL DEFAULT '[]'"),
    ("cells", "origin", "TEXT NOT NULL DEFAULT ''"),
    ("cells", "context", "TEXT"),
    ("cells", "files_read", "TEXT NOT NULL DEFAULT '[]'"),
    ("cells", "files_written", "TEXT NOT NULL DEFAULT '[]'"),
    ("cells", "files_truncated", "INTEGER NOT NULL DEFAULT 0"),
    ("cells", "error", "TEXT"),
    ("tool_calls", "cell_id", "TEXT NOT NULL DEFAULT ''"),
    ("tool_calls", "seq", "INTEGER NOT NULL DEFAULT 0"),
    ("tool_calls", "tool", "TEXT NOT NULL DEFAULT ''"),
    ("tool_calls", "args_preview", "TEXT NOT NULL DEFAULT ''"),
    ("tool_calls", "duration_ms", "INTEGER NOT NULL DEFAULT 0"),
    ("tool_calls", "outcome", "TEXT NOT NULL DEFAULT ''"),
    ("tool_calls", "error", "TEXT"),
    ("network_denials", "cell_id", "TEXT NOT NULL DEFAULT ''"),
    ("network_denials", "seq", "INTEGER NOT NULL DEFAULT 0"),
    ("network_denials", "host", "TEXT NOT NULL DEFAULT ''"),
    ("network_denials", "port", "INTEGER NOT NULL DEFAULT 0"),
    ("network_denials", "reason", "TEXT NOT NULL DEFAULT ''"),
    ("network_denials", "sni", "TEXT"),
    ("checkpoints", "owner", "TEXT NOT NULL DEFAULT ''"),
    ("checkpoints", "session", "TEXT NOT NULL DEFAULT ''"),
    ("checkpoints", "mode", "TEXT NOT NULL DEFAULT 'namespace'"),
    ("checkpoints", "generation", "INTEGER NOT NULL DEFAULT 0"),
    ("checkpoints", "execution_count", "INTEGER NOT NULL DEFAULT 0"),
    ("checkpoints", "taken_ms", "INTEGER NOT NULL DEFAULT 0"),
    ("checkpoints", "path", "TEXT NOT NULL DEFAULT ''"),
    ("checkpoints", "bytes", "INTEGER NOT NULL DEFAULT 0"),
    ("checkpoints", "saved", "TEXT NOT NULL DEFAULT '[]'"),
    ("checkpoints", "lost", "TEXT NOT NULL DEFAULT '[]'"),
    ("checkpoints", "paused_ms", "INTEGER"),
];

/// Why a journal's schema cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum SchemaError {
    /// The journal was written by a newer cellhost.
    #[error(
        "schema version {found} is newer than this cellhost supports ({supported}); use a newer cellhost"
    )]
    Newer {
        /// `PRAGMA user_version` of the file.
        found: i64,
        /// [`SCHEMA_VERSION`].
        supported: i64,
    },
    /// SQLite failed while reading or migrating.
    #[error("{0}")]
    Sqlite(#[from] rusqlite::Error),
}

/// The journal's `PRAGMA user_version`.
///
/// # Errors
/// SQLite's.
pub fn version(conn: &Connection) -> rusqlite::Result<i64> {
    conn.query_row("PRAGMA user_version", [], |r| r.get(0))
}

fn columns_of(conn: &Connection, table: &str) -> rusqlite::Result<Vec<String>> {
    let mut st = conn.prepare("SELECT name FROM pragma_table_info(?1)")?;
    let names = st.query_map(params![table], |r| r.get::<_, String>(0))?;
    names.collect()
}

/// Brings the journal up to [`SCHEMA_VERSION`] in one transaction; returns
/// the version it was at.
///
/// # Errors
/// [`SchemaError::Newer`] for a journal of a newer version (left
/// untouched); SQLite's errors otherwise (the transaction is rolled back).
pub fn migrate(conn: &mut Connection) -> Result<i64, SchemaError> {
    let found = version(conn)?;
    if found > SCHEMA_VERSION {
        return Err(SchemaError::Newer {
            found,
            supported: SCHEMA_VERSION,
        });
    }
    if found == SCHEMA_VERSION {
        return Ok(found);
    }
    let tx = conn.transaction()?;
    if found < SCHEMA_VERSION {
        // Every earlier version: whatever tables and columns are missing
        // (version 1 lacks `sessions.language`, `network_denials` and
        // `credential_nonces`, version 2 the two tables, version 3
        // `credential_nonces`, version 4 the kernels' lineage and placement
        // and `sessions.settings`, version 5 `kernels.placement` and
        // `sessions.settings`, version 7 `sessions.settings`, every version
        // before 9 `checkpoints`); `SCHEMA` creates missing tables.
        tx.execute_batch(SCHEMA)?;
        for table in [
            "sessions",
            "kernels",
            "cells",
            "tool_calls",
            "network_denials",
            "checkpoints",
        ] {
            let have = columns_of(&tx, table)?;
            for (_, column, decl) in COLUMNS.iter().filter(|(t, _, _)| *t == table) {
                if !have.iter().any(|h| h == column) {
                    tx.execute_batch(&format!("ALTER TABLE {table} ADD COLUMN {column} {decl}"))?;
                }
            }
        }
    }
    tx.pragma_update(None, "user_version", SCHEMA_VERSION)?;
    tx.commit()?;
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The layout of the first release: [`SCHEMA`] without a version.
    fn unversioned(conn: &Connection) {
        conn.execute_batch(SCHEMA).expect("schema");
    }

    /// Version 1: the sessions table without `language`, with a row.
    fn version_1(conn: &Connection) {
        conn.execute_batch(
            "CREATE TABLE sessions (owner TEXT NOT NULL, session TEXT NOT NULL,
               created_ms INTEGER NOT NULL, last_used_ms INTEGER NOT NULL,
               python TEXT, cwd TEXT, tools TEXT, profile TEXT,
               PRIMARY KEY (owner, session));
             INSERT INTO sessions VALUES ('o', 's', 1, 2, '/usr/bin/python3', '', '', 'default');
             PRAGMA user_version = 1;",
        )
        .expect("version 1 schema");
    }

    /// Version 2: every table but `network_denials` and `credential_nonces`.
    fn version_2(conn: &Connection) {
        let without = SCHEMA
            .split_inclusive(';')
            .filter(|stmt| !stmt.contains("network_denials") && !stmt.contains("credential_nonces"))
            .collect::<String>();
        conn.execute_batch(&format!("{without}\nPRAGMA user_version = 2;"))
            .expect("version 2 schema");
    }

    /// Version 4: every table but `checkpoints`, kernels without their lineage and the
    /// sessions table without `settings`, with a row in each.
    fn version_4(conn: &Connection) {
        let schema = SCHEMA
            .replace(" settings TEXT,", "")
            .replace(
                "parent_session TEXT, parent_generation INTEGER, fork_point INTEGER,",
                "",
            )
            .replace("\n  placement TEXT,", "")
            .split_inclusive(';')
            .filter(|stmt| !stmt.contains("checkpoints"))
            .collect::<String>();
        assert!(
            !schema.contains("settings TEXT"),
            "version 4 lacks sessions.settings"
        );
        assert!(!schema.contains("fork_point"), "version 4 lacks the lineage");
        assert!(!schema.contains("placement"), "version 4 lacks kernels.placement");
        conn.execute_batch(&format!(
            "{schema}\nINSERT INTO sessions (owner, session, created_ms, last_used_ms) VALUES ('o', 's', 1, 2);\nINSERT INTO kernels (owner, session, generation, pid, started_ms) VALUES ('o', 's', 1, 7, 5);\nINSERT INTO cells (id, owner, session, generation, code, status, started_ms) VALUES ('c4', 'o', 's', 1, 'x = 1', 'ok', 5);\nPRAGMA user_version = 4;"
        ))
        .expect("version 4 schema");
    }

    /// An older, narrower layout: cells without execution counts, origin,
    /// context, files or error; kernels without end reasons; no tool calls.
    fn narrow(conn: &Connection) {
        conn.execute_batch(
            "CREATE TABLE sessions (owner TEXT NOT NULL, session TEXT NOT NULL,
               created_ms INTEGER NOT NULL, last_used_ms INTEGER NOT NULL,
               PRIMARY KEY (owner, session));
             CREATE TABLE kernels (owner TEXT NOT NULL, session TEXT NOT NULL,
               generation INTEGER NOT NULL, pid INTEGER, started_ms INTEGER NOT NULL,
               ended_ms INTEGER, PRIMARY KEY (owner, session, generation));
             CREATE TABLE cells (id TEXT PRIMARY KEY, owner TEXT NOT NULL,
               session TEXT NOT NULL, generation INTEGER NOT NULL, code TEXT NOT NULL,
               status TEXT NOT NULL, started_ms INTEGER NOT NULL, ended_ms INTEGER,
               duration_ms INTEGER, stdout_head TEXT NOT NULL DEFAULT '',
               stdout_tail TEXT NOT NULL DEFAULT '');
             INSERT INTO cells (id, owner, session, generation, code, status, started_ms)
               VALUES ('old', 'o', 's', 1, 'x = 1', 'ok', 5);",
        )
        .expect("narrow schema");
    }

    #[test]
    fn every_earlier_layout_migrates_to_every_column() {
        for (name, make) in [
            ("empty", (|_: &Connection| {}) as fn(&Connection)),
            ("unversioned", unversioned),
            ("narrow", narrow),
            ("version 1", version_1),
            ("version 2", version_2),
            ("version 4", version_4),
        ] {
            let mut conn = Connection::open_in_memory().expect("db");
            make(&conn);
            let from = match name {
                "version 1" => 1,
                "version 2" => 2,
                "version 4" => 4,
                _ => 0,
            };
            assert_eq!(migrate(&mut conn).expect(name), from, "{name}");
            assert_eq!(version(&conn).expect("version"), SCHEMA_VERSION, "{name}");
            for (table, column, _) in COLUMNS {
                let have = columns_of(&conn, table).expect("columns");
                assert!(
                    have.iter().any(|h| h == column),
                    "{name}: {table}.{column} missing"
                );
            }
            if name == "version 4" {
                // The old row is kept, with no settings of its own.
                let settings: Option<String> = conn
                    .query_row(
                        "SELECT settings FROM sessions WHERE owner='o' AND session='s'",
                        [],
                        |r| r.get(0),
                    )
                    .expect("old row");
                assert_eq!(settings, None);
            }
            if name == "version 1" {
                // The old row is kept; its language is unknown (Python).
                let lang: Option<String> = conn
                    .query_row(
                        "SELECT language FROM sessions WHERE owner='o' AND session='s'",
                        [],
                        |r| r.get(0),
                    )
                    .expect("old row");
                assert_eq!(lang, None);
            }
            if name == "version 4" {
                // The old kernel is kept, with no parent.
                let parent: Option<String> = conn
                    .query_row(
                        "SELECT parent_session FROM kernels WHERE owner='o' AND session='s'",
                        [],
                        |r| r.get(0),
                    )
                    .expect("old kernel row");
                assert_eq!(parent, None);
                // The local kernel of the old row ran nowhere else.
                let placement: Option<String> = conn
                    .query_row("SELECT placement FROM kernels WHERE generation=1", [], |r| {
                        r.get(0)
                    })
                    .expect("old kernel row");
                assert_eq!(placement, None);
                // Its cells are kept, and sessions start without checkpoints.
                let (cells, ckpts): (i64, i64) = conn
                    .query_row(
                        "SELECT (SELECT COUNT(*) FROM cells), (SELECT COUNT(*) FROM checkpoints)",
                        [],
                        |r| Ok((r.get(0)?, r.get(1)?)),
                    )
                    .expect("counts");
                assert_eq!((cells, ckpts), (1, 0));
            }
            // A second open has nothing left to do.
            assert_eq!(migrate(&mut conn).expect("again"), SCHEMA_VERSION, "{name}");
        }
    }

    #[test]
    fn columns_list_matches_the_schema() {
        let conn = Connection::open_in_memory().expect("db");
        conn.execute_batch(SCHEMA).expect("schema");
        for table in [
            "sessions",
            "kernels",
            "cells",
            "tool_calls",
            "network_denials",
            "checkpoints",
        ] {
            let mut have = columns_of(&conn, table).expect("columns");
            let mut listed: Vec<String> = COLUMNS
                .iter()
                .filter(|(t, _, _)| *t == table)
                .map(|(_, c, _)| c.to_string())
                .collect();
            have.sort();
            listed.sort();
            assert_eq!(have, listed, "COLUMNS must list every column of {table}");
        }
    }

    #[test]
    fn newer_journal_is_refused_untouched() {
        let mut conn = Connection::open_in_memory().expect("db");
        conn.execute_batch("CREATE TABLE future (x); PRAGMA user_version = 99;")
            .expect("future");
        match migrate(&mut conn) {
            Err(SchemaError::Newer { found: 99, supported }) => assert_eq!(supported, SCHEMA_VERSION),
            other => panic!("expected Newer, got {other:?}"),
        }
        assert_eq!(version(&conn).expect("version"), 99);
        assert!(columns_of(&conn, "cells").expect("columns").is_empty());
    }
}
