//! SQLite storage: current objects, the change log that watches resume from, and the
//! single resourceVersion counter.
//!
//! Every write runs under one mutex: it takes the next resourceVersion, stores the object,
//! appends to the change log and publishes the change to live watchers before the lock is
//! released. That makes resourceVersions strictly increasing in commit order and guarantees
//! watchers see changes in that same order, which is what the watch protocol promises.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};

use rusqlite::{Connection, OpenFlags, OptionalExtension, params};
use serde_json::Value;
use tokio::sync::broadcast;

/// How many changes are kept for watches that resume from an older resourceVersion.
/// Older resourceVersions get `410 Expired`, exactly like a compacted etcd.
pub const DEFAULT_HISTORY: u64 = 10_000;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("storage: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("storage: stored object is not valid JSON: {0}")]
    Corrupt(#[from] serde_json::Error),
    #[error("storage: making {path} owner-only: {source}")]
    Private {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
}

/// Why a conditional write was refused.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error("object not found")]
    NotFound,
    #[error("object already exists")]
    AlreadyExists,
    #[error("resourceVersion precondition failed")]
    Conflict,
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<rusqlite::Error> for WriteError {
    fn from(e: rusqlite::Error) -> Self {
        WriteError::Store(e.into())
    }
}

/// Identifies one stored object. `resource` is the storage key shared by every served
/// version of a resource (`/events` serves both core/v1 and events.k8s.io/v1 Events).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ObjectKey {
    pub resource: String,
    pub namespace: String,
    pub name: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeType {
    Added,
    Modified,
    Deleted,
}

impl ChangeType {
    pub fn as_str(self) -> &'static str {
        match self {
            ChangeType::Added => "ADDED",
            ChangeType::Modified => "MODIFIED",
            ChangeType::Deleted => "DELETED",
        }
    }

    fn parse(s: &str) -> Self {
        match s {
            "ADDED" => ChangeType::Added,
            "DELETED" => ChangeType::Deleted,
            _ => ChangeType::Modified,
        }
    }
}

/// One committed write, as watchers see it.
#[derive(Debug, Clone)]
pub struct Change {
    pub rv: u64,
    pub key: ObjectKey,
    pub kind: ChangeType,
    /// The object after the write (for deletes: its last state, stamped with the delete's resourceVersion).
    pub object: Arc<Value>,
    /// The object before a modification, as stored (live changes only; the change log does not
    /// keep it). Watches with selectors parse it to turn "stopped matching" into DELETED, as
    /// kube-apiserver does; the others never need it, so it is not parsed for them.
    pub previous: Option<Arc<str>>,
    /// The object's JSON as watches send it: as stored, and encoded by the first watch that
    /// sends it in another form, shared with the others that send the same (every Secret write
    /// reaches several).
    pub encoded: Encoded,
}

/// Encodings of a change's object (see [`Change::encoded`]).
#[derive(Debug, Clone, Default)]
pub struct Encoded {
    /// The object's JSON as the store wrote it, when the change carries it.
    stored: Option<bytes::Bytes>,
    /// By form.
    forms: Arc<Mutex<Vec<(String, bytes::Bytes)>>>,
}

impl Encoded {
    /// Encodings of an object whose stored JSON is `stored`.
    fn of_stored(stored: bytes::Bytes) -> Self {
        Self {
            stored: Some(stored),
            forms: Arc::default(),
        }
    }

    /// The object's JSON as stored, if known.
    pub fn as_stored(&self) -> Option<&bytes::Bytes> {
        self.stored.as_ref()
    }

    /// The encoding of the object in `form`, made by `encode` if no watch has made it yet.
    pub fn get_or_encode(&self, form: &str, encode: impl FnOnce() -> bytes::Bytes) -> bytes::Bytes {
        let mut forms = self.forms.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, bytes)) = forms.iter().find(|(f, _)| f == form) {
            return bytes.clone();
        }
        let bytes = encode();
        forms.push((form.to_string(), bytes.clone()));
        bytes
    }
}

pub struct Store {
    conn: Mutex<Connection>,
    changes: broadcast::Sender<Arc<Change>>,
    history: u64,
    /// Storage key → the resourceVersion of its last write since the store was opened.
    latest_writes: Mutex<HashMap<String, u64>>,
}

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS objects (
    resource TEXT NOT NULL, namespace TEXT NOT NULL, name TEXT NOT NULL,
    rv INTEGER NOT NULL, body TEXT NOT NULL,
    PRIMARY KEY (resource, namespace, name)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS objects_by_namespace ON objects(namespace);
CREATE TABLE IF NOT EXISTS changes (
    rv INTEGER PRIMARY KEY, resource TEXT NOT NULL, namespace TEXT NOT NULL, name TEXT NOT NULL,
    type TEXT NOT NULL, body TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS changes_by_resource ON changes(resource, rv);
CREATE TABLE IF NOT EXISTS owners (
    owner_uid TEXT NOT NULL, resource TEXT NOT NULL, namespace TEXT NOT NULL, name TEXT NOT NULL,
    PRIMARY KEY (owner_uid, resource, namespace, name)) WITHOUT ROWID;
-- Every write replaces its object's rows: without this, each one scanned the whole table.
CREATE INDEX IF NOT EXISTS owners_by_object ON owners(resource, namespace, name);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
INSERT OR IGNORE INTO meta VALUES ('rv', 0), ('compacted', 0);
";

/// Makes the database at `path` and the files SQLite keeps beside it owner-only. The database
/// file is created 0600 before SQLite opens it, because SQLite gives the WAL, shared-memory and
/// journal files it creates later the database file's mode.
fn make_private(path: &Path) -> Result<(), StoreError> {
    let failed = |p: &Path| {
        let path = p.to_path_buf();
        move |source| StoreError::Private { path, source }
    };
    crate::store::private_files::create_file(path).map_err(failed(path))?;
    for suffix in ["-wal", "-shm", "-journal"] {
        let mut companion = path.as_os_str().to_owned();
        companion.push(suffix);
        let companion = Path::new(&companion);
        crate::store::private_files::restrict(companion).map_err(failed(companion))?;
    }
    Ok(())
}

impl Store {
    /// Opens (or creates) the database at `path`, or an in-memory one when `path` is None.
    pub fn open(path: Option<&Path>) -> Result<Self, StoreError> {
        let conn = match path {
            Some(p) => {
                make_private(p)?;
                Connection::open(p)?
            }
            // Not `:memory:`: SQLite's pager keeps such a database in its page cache and scans
            // that cache's whole hash table at every commit, so each write costs in proportion
            // to the data stored (a fifth of the API server's time at 10,000 objects). The
            // `memdb` VFS keeps the pages in memory behind an ordinary pager. A name without a
            // leading `/` is private to this connection.
            None => Connection::open_with_flags(
                "file:caretaker?vfs=memdb",
                OpenFlags::SQLITE_OPEN_READ_WRITE
                    | OpenFlags::SQLITE_OPEN_CREATE
                    | OpenFlags::SQLITE_OPEN_URI
                    | OpenFlags::SQLITE_OPEN_NO_MUTEX,
            )?,
        };
        // On disk, WAL + NORMAL: durable across process crashes, fast enough for thousands of
        // writes/s. In memory there is nothing to be durable for: the rollback journal too.
        let journal = if path.is_some() { "WAL" } else { "MEMORY" };
        conn.pragma_update(None, "journal_mode", journal)?;
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        conn.execute_batch(SCHEMA)?;
        let (tx, _) = broadcast::channel(8192);
        Ok(Store {
            conn: Mutex::new(conn),
            changes: tx,
            history: DEFAULT_HISTORY,
            latest_writes: Mutex::new(HashMap::new()),
        })
    }

    /// Keeps `changes` changes for resuming watches (default [`DEFAULT_HISTORY`]).
    pub fn with_history(mut self, changes: u64) -> Self {
        self.history = changes.max(1);
        self
    }

    fn lock(&self) -> MutexGuard<'_, Connection> {
        // A panic while holding the lock cannot leave SQLite half-written (transactions roll back), so
        // a poisoned lock is still safe to use.
        self.conn.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn subscribe(&self) -> broadcast::Receiver<Arc<Change>> {
        self.changes.subscribe()
    }

    /// The resourceVersion of the last write to `resource` (a storage key) since the store was
    /// opened, 0 if none: caches of a few kinds compare it to know they are current.
    pub fn latest_write(&self, resource: &str) -> u64 {
        let latest = self.latest_writes.lock().unwrap_or_else(|p| p.into_inner());
        latest.get(resource).copied().unwrap_or(0)
    }

    /// The newest resourceVersion handed out.
    pub fn current_rv(&self) -> Result<u64, StoreError> {
        Ok(meta(&self.lock(), "rv")?)
    }

    pub fn get(&self, key: &ObjectKey) -> Result<Option<Value>, StoreError> {
        let conn = self.lock();
        // Cached: every patch starts with a get.
        let body: Option<String> = conn
            .prepare_cached(
                "SELECT body FROM objects WHERE resource=?1 AND namespace=?2 AND name=?3",
            )?
            .query_row(params![key.resource, key.namespace, key.name], |r| r.get(0))
            .optional()?;
        Ok(body.map(|b| serde_json::from_str(&b)).transpose()?)
    }

    /// Objects of `resource` (in `namespace`, or everywhere when None) ordered by (namespace, name),
    /// starting after `after`. Returns them with the resourceVersion the list is consistent with.
    pub fn list(
        &self,
        resource: &str,
        namespace: Option<&str>,
        after: Option<(&str, &str)>,
    ) -> Result<(Vec<Value>, u64), StoreError> {
        self.list_page(resource, namespace, after, None)
    }

    /// How many objects of `resource` (in `namespace`, or everywhere) come after `after` in
    /// list order: a paged list's `remainingItemCount`.
    pub fn count_after(
        &self,
        resource: &str,
        namespace: Option<&str>,
        after: (&str, &str),
    ) -> Result<u64, StoreError> {
        let conn = self.lock();
        let count: i64 = match namespace {
            Some(ns) => conn
                .prepare_cached(
                    "SELECT COUNT(*) FROM objects WHERE resource=?1 AND namespace=?2 AND (namespace, name) > (?3, ?4)",
                )?
                .query_row(params![resource, ns, after.0, after.1], |r| r.get(0))?,
            None => conn
                .prepare_cached(
                    "SELECT COUNT(*) FROM objects WHERE resource=?1 AND (namespace, name) > (?2, ?3)",
                )?
                .query_row(params![resource, after.0, after.1], |r| r.get(0))?,
        };
        Ok(u64::try_from(count).unwrap_or(0))
    }

    /// Like [`Self::list`], with at most `max` objects.
    pub fn list_page(
        &self,
        resource: &str,
        namespace: Option<&str>,
        after: Option<(&str, &str)>,
        max: Option<usize>,
    ) -> Result<(Vec<Value>, u64), StoreError> {
        let conn = self.lock();
        // Separate statements per shape, so that SQLite can range-scan the primary key.
        let mut sql = String::from("SELECT body FROM objects WHERE resource=?1");
        if namespace.is_some() {
            sql.push_str(" AND namespace=?2");
        }
        if after.is_some() {
            sql.push_str(" AND (namespace, name) > (?3, ?4)");
        }
        sql.push_str(" ORDER BY namespace, name LIMIT ?5");
        let mut stmt = conn.prepare_cached(&sql)?;
        let (after_ns, after_name) = after.unwrap_or(("", ""));
        let limit = max.map_or(-1, |m| i64::try_from(m).unwrap_or(i64::MAX));
        let mut out = Vec::new();
        let mut bind = |stmt: &mut rusqlite::CachedStatement<'_>| -> Result<(), StoreError> {
            stmt.raw_bind_parameter(1, resource)?;
            if let Some(ns) = namespace {
                stmt.raw_bind_parameter(2, ns)?;
            }
            if after.is_some() {
                stmt.raw_bind_parameter(3, after_ns)?;
                stmt.raw_bind_parameter(4, after_name)?;
            }
            stmt.raw_bind_parameter(5, limit)?;
            let mut rows = stmt.raw_query();
            while let Some(row) = rows.next()? {
                out.push(serde_json::from_str(&row.get::<_, String>(0)?)?);
            }
            Ok(())
        };
        bind(&mut stmt)?;
        let rv = meta(&conn, "rv")?;
        Ok((out, rv))
    }

    /// Every stored key in `namespace`, of any resource (for namespace deletion).
    pub fn keys_in_namespace(&self, namespace: &str) -> Result<Vec<ObjectKey>, StoreError> {
        let conn = self.lock();
        let mut stmt =
            conn.prepare_cached("SELECT resource, name FROM objects WHERE namespace=?1")?;
        let rows = stmt.query_map(params![namespace], |r| {
            Ok(ObjectKey {
                resource: r.get(0)?,
                namespace: namespace.to_string(),
                name: r.get(1)?,
            })
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Objects whose metadata.ownerReferences name `owner_uid` (for garbage collection).
    pub fn dependents(&self, owner_uid: &str) -> Result<Vec<ObjectKey>, StoreError> {
        let conn = self.lock();
        let mut stmt =
            conn.prepare_cached("SELECT resource, namespace, name FROM owners WHERE owner_uid=?1")?;
        let rows = stmt.query_map(params![owner_uid], |r| {
            Ok(ObjectKey {
                resource: r.get(0)?,
                namespace: r.get(1)?,
                name: r.get(2)?,
            })
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Every owner uid referenced by some stored object (for the orphan sweep).
    pub fn referenced_owner_uids(&self) -> Result<Vec<String>, StoreError> {
        let conn = self.lock();
        let mut stmt = conn.prepare_cached("SELECT DISTINCT owner_uid FROM owners")?;
        let rows = stmt.query_map([], |r| r.get(0))?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Whether any stored object has this uid.
    pub fn uid_exists(&self, uid: &str) -> Result<bool, StoreError> {
        let conn = self.lock();
        // uids are unique; a LIKE on the body would be slow, so look in the JSON.
        let found: Option<i64> = conn
            .query_row(
                "SELECT 1 FROM objects WHERE json_extract(body, '$.metadata.uid') = ?1 LIMIT 1",
                params![uid],
                |r| r.get(0),
            )
            .optional()?;
        Ok(found.is_some())
    }

    /// The object with this uid, if any.
    pub fn find_by_uid(&self, uid: &str) -> Result<Option<(ObjectKey, Value)>, StoreError> {
        let conn = self.lock();
        let row: Option<(String, String, String, String)> = conn
            .query_row(
                "SELECT resource, namespace, name, body FROM objects WHERE json_extract(body, '$.metadata.uid') = ?1 LIMIT 1",
                params![uid],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
            )
            .optional()?;
        match row {
            Some((resource, namespace, name, body)) => Ok(Some((
                ObjectKey {
                    resource,
                    namespace,
                    name,
                },
                serde_json::from_str(&body)?,
            ))),
            None => Ok(None),
        }
    }

    /// Objects marked for deletion (waiting for finalizers).
    pub fn deleting_objects(&self) -> Result<Vec<(ObjectKey, Value)>, StoreError> {
        let conn = self.lock();
        let mut stmt = conn.prepare_cached(
            "SELECT resource, namespace, name, body FROM objects WHERE json_extract(body, '$.metadata.deletionTimestamp') IS NOT NULL",
        )?;
        let rows = stmt.query_map([], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, String>(2)?,
                r.get::<_, String>(3)?,
            ))
        })?;
        let mut out = Vec::new();
        for row in rows {
            let (resource, namespace, name, body) = row?;
            out.push((
                ObjectKey {
                    resource,
                    namespace,
                    name,
                },
                serde_json::from_str(&body)?,
            ));
        }
        Ok(out)
    }

    /// Stores a new object. Fails with AlreadyExists if the key is taken.
    pub fn create(&self, key: &ObjectKey, object: Value) -> Result<Arc<Value>, WriteError> {
        self.write(key, object, |existing| match existing {
            Some(_) => Err(WriteError::AlreadyExists),
            None => Ok(ChangeType::Added),
        })
    }

    /// Replaces an existing object. With `expected_rv`, fails with Conflict unless the stored
    /// object still has that resourceVersion.
    pub fn update(
        &self,
        key: &ObjectKey,
        expected_rv: Option<u64>,
        object: Value,
    ) -> Result<Arc<Value>, WriteError> {
        self.write(key, object, |existing| match existing {
            None => Err(WriteError::NotFound),
            Some(rv) if expected_rv.is_some_and(|e| e != rv) => Err(WriteError::Conflict),
            Some(_) => Ok(ChangeType::Modified),
        })
    }

    /// Removes an object for good (finalizers are the caller's business).
    pub fn delete(
        &self,
        key: &ObjectKey,
        expected_rv: Option<u64>,
    ) -> Result<Arc<Value>, WriteError> {
        let mut conn = self.lock();
        let tx = conn.transaction()?;
        let stored: Option<(i64, String)> = tx
            .prepare_cached(
                "SELECT rv, body FROM objects WHERE resource=?1 AND namespace=?2 AND name=?3",
            )?
            .query_row(params![key.resource, key.namespace, key.name], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })
            .optional()?;
        let Some((rv, body)) = stored else {
            return Err(WriteError::NotFound);
        };
        if expected_rv.is_some_and(|e| e != rv as u64) {
            return Err(WriteError::Conflict);
        }
        let mut object: Value = serde_json::from_str(&body).map_err(StoreError::from)?;
        let new_rv = meta(&tx, "rv")? + 1;
        set_rv(&mut object, new_rv);
        tx.prepare_cached("DELETE FROM objects WHERE resource=?1 AND namespace=?2 AND name=?3")?
            .execute(params![key.resource, key.namespace, key.name])?;
        tx.prepare_cached("DELETE FROM owners WHERE resource=?1 AND namespace=?2 AND name=?3")?
            .execute(params![key.resource, key.namespace, key.name])?;
        let object = Arc::new(object);
        let body = object.to_string();
        self.commit(
            tx,
            new_rv,
            key,
            ChangeType::Deleted,
            body,
            object.clone(),
            None,
        )?;
        Ok(object)
    }

    fn write(
        &self,
        key: &ObjectKey,
        mut object: Value,
        check: impl FnOnce(Option<u64>) -> Result<ChangeType, WriteError>,
    ) -> Result<Arc<Value>, WriteError> {
        let mut conn = self.lock();
        let tx = conn.transaction()?;
        let existing: Option<(i64, String)> = tx
            .prepare_cached(
                "SELECT rv, body FROM objects WHERE resource=?1 AND namespace=?2 AND name=?3",
            )?
            .query_row(params![key.resource, key.namespace, key.name], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })
            .optional()?;
        let kind = check(existing.as_ref().map(|(rv, _)| *rv as u64))?;
        let previous = existing.map(|(_, body)| Arc::from(body));
        let new_rv = meta(&tx, "rv")? + 1;
        set_rv(&mut object, new_rv);
        let body = object.to_string();
        tx.prepare_cached("INSERT OR REPLACE INTO objects (resource, namespace, name, rv, body) VALUES (?1, ?2, ?3, ?4, ?5)")?.execute(params![key.resource, key.namespace, key.name, new_rv as i64, body],
        )?;
        tx.prepare_cached("DELETE FROM owners WHERE resource=?1 AND namespace=?2 AND name=?3")?
            .execute(params![key.resource, key.namespace, key.name])?;
        if let Some(refs) = object
            .pointer("/metadata/ownerReferences")
            .and_then(Value::as_array)
        {
            for uid in refs
                .iter()
                .filter_map(|r| r.get("uid").and_then(Value::as_str))
            {
                tx.prepare_cached("INSERT OR IGNORE INTO owners VALUES (?1, ?2, ?3, ?4)")?
                    .execute(params![uid, key.resource, key.namespace, key.name])?;
            }
        }
        let object = Arc::new(object);
        self.commit(tx, new_rv, key, kind, body, object.clone(), previous)?;
        Ok(object)
    }

    /// Appends to the change log, compacts it, commits and publishes. Called with the lock held.
    /// `body`: `object` as JSON, encoded once for both tables.
    #[allow(clippy::too_many_arguments)]
    fn commit(
        &self,
        tx: rusqlite::Transaction<'_>,
        rv: u64,
        key: &ObjectKey,
        kind: ChangeType,
        body: String,
        object: Arc<Value>,
        previous: Option<Arc<str>>,
    ) -> Result<(), WriteError> {
        tx.prepare_cached("INSERT INTO changes (rv, resource, namespace, name, type, body) VALUES (?1, ?2, ?3, ?4, ?5, ?6)")?.execute(params![rv as i64, key.resource, key.namespace, key.name, kind.as_str(), body],
        )?;
        tx.prepare_cached("UPDATE meta SET value=?1 WHERE key='rv'")?
            .execute(params![rv as i64])?;
        // Compact in batches so that the history stays bounded without a delete per write.
        if rv.is_multiple_of(1000) && rv > self.history {
            let floor = rv - self.history;
            tx.prepare_cached("DELETE FROM changes WHERE rv <= ?1")?
                .execute(params![floor as i64])?;
            tx.prepare_cached("UPDATE meta SET value=?1 WHERE key='compacted'")?
                .execute(params![floor as i64])?;
        }
        tx.commit()?;
        {
            let mut latest = self.latest_writes.lock().unwrap_or_else(|p| p.into_inner());
            match latest.get_mut(&key.resource) {
                Some(last) => *last = rv,
                None => {
                    latest.insert(key.resource.clone(), rv);
                }
            }
        }
        // No receivers is fine: nobody is watching.
        let _ = self.changes.send(Arc::new(Change {
            rv,
            key: key.clone(),
            kind,
            object,
            previous,
            encoded: Encoded::of_stored(body.into()),
        }));
        Ok(())
    }

    /// Changes of `resource` after `since`, or Err(oldest retained) if `since` is compacted away.
    pub fn changes_since(
        &self,
        resource: &str,
        since: u64,
    ) -> Result<Result<Vec<Change>, u64>, StoreError> {
        let conn = self.lock();
        let compacted = meta(&conn, "compacted")?;
        if since < compacted {
            return Ok(Err(compacted + 1));
        }
        let mut stmt = conn.prepare_cached(
            "SELECT rv, namespace, name, type, body FROM changes WHERE resource=?1 AND rv > ?2 ORDER BY rv",
        )?;
        let rows = stmt.query_map(params![resource, since as i64], |r| {
            Ok((
                r.get::<_, i64>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, String>(2)?,
                r.get::<_, String>(3)?,
                r.get::<_, String>(4)?,
            ))
        })?;
        let mut out = Vec::new();
        for row in rows {
            let (rv, namespace, name, kind, body) = row?;
            out.push(Change {
                rv: rv as u64,
                key: ObjectKey {
                    resource: resource.to_string(),
                    namespace,
                    name,
                },
                kind: ChangeType::parse(&kind),
                object: Arc::new(serde_json::from_str(&body)?),
                previous: None,
                encoded: Encoded::of_stored(body.into()),
            });
        }
        Ok(Ok(out))
    }
}

fn meta(conn: &Connection, key: &str) -> Result<u64, rusqlite::Error> {
    conn.prepare_cached("SELECT value FROM meta WHERE key=?1")?
        .query_row(params![key], |r| r.get::<_, i64>(0))
        .map(|v| v as u64)
}

fn set_rv(object: &mut Value, rv: u64) {
    if let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.insert("resourceVersion".into(), Value::String(rv.to_string()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn key(name: &str) -> ObjectKey {
        ObjectKey {
            resource: "/configmaps".into(),
            namespace: "default".into(),
            name: name.into(),
        }
    }

    /// A write replaces its object's owner rows; at 10,000 owned objects a scan of the table
    /// per write was most of the server's time.
    #[test]
    fn replacing_an_objects_owner_rows_uses_an_index() {
        let store = Store::open(None).unwrap();
        let conn = store.lock();
        let plan: Vec<String> = conn
            .prepare("EXPLAIN QUERY PLAN DELETE FROM owners WHERE resource=?1 AND namespace=?2 AND name=?3")
            .unwrap()
            .query_map(params!["r", "n", "x"], |row| row.get::<_, String>(3))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        assert!(
            plan.iter()
                .any(|step| step.contains("USING") && step.contains("owners_by_object")),
            "{plan:?}"
        );
    }

    /// Each in-memory store is its own database, whatever the others in the process hold.
    #[test]
    fn in_memory_stores_share_nothing() {
        let (one, two) = (Store::open(None).unwrap(), Store::open(None).unwrap());
        let object = json!({ "metadata": { "name": "a", "namespace": "default" } });
        one.create(&key("a"), object.clone()).unwrap();
        assert!(two.get(&key("a")).unwrap().is_none());
        two.create(&key("a"), object).unwrap();
        assert_eq!(one.current_rv().unwrap(), 1);
        assert_eq!(two.current_rv().unwrap(), 1);
        let journal: String = (one.lock())
            .pragma_query_value(None, "journal_mode", |row| row.get(0))
            .unwrap();
        assert_eq!(journal, "memory");
    }

    #[test]
    fn resource_versions_increase_and_survive_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db.sqlite");
        {
            let store = Store::open(Some(&path)).unwrap();
            store
                .create(&key("a"), json!({"metadata": {"name": "a"}}))
                .unwrap();
            let b = store
                .create(&key("b"), json!({"metadata": {"name": "b"}}))
                .unwrap();
            assert_eq!(b["metadata"]["resourceVersion"], "2");
            assert!(matches!(
                store.create(&key("a"), json!({"metadata": {}})),
                Err(WriteError::AlreadyExists)
            ));
            assert!(matches!(
                store.update(&key("a"), Some(7), json!({"metadata": {}})),
                Err(WriteError::Conflict)
            ));
        }
        let store = Store::open(Some(&path)).unwrap();
        assert_eq!(store.current_rv().unwrap(), 2);
        let c = store
            .update(&key("a"), Some(1), json!({"metadata": {"name": "a"}}))
            .unwrap();
        assert_eq!(c["metadata"]["resourceVersion"], "3");
        let changes = store.changes_since("/configmaps", 1).unwrap().unwrap();
        assert_eq!(changes.iter().map(|c| c.rv).collect::<Vec<_>>(), vec![2, 3]);
    }

    #[test]
    fn pages_follow_namespace_and_name_order() {
        let store = Store::open(None).unwrap();
        for (ns, name) in [("b", "1"), ("a", "2"), ("a", "1"), ("c", "0")] {
            let key = ObjectKey {
                resource: "/configmaps".into(),
                namespace: ns.into(),
                name: name.into(),
            };
            store
                .create(&key, json!({"metadata": {"namespace": ns, "name": name}}))
                .unwrap();
        }
        let names = |objs: Vec<Value>| -> Vec<String> {
            objs.iter()
                .map(|o| {
                    format!(
                        "{}/{}",
                        o["metadata"]["namespace"].as_str().unwrap(),
                        o["metadata"]["name"].as_str().unwrap()
                    )
                })
                .collect()
        };
        let (page, _) = store.list_page("/configmaps", None, None, Some(2)).unwrap();
        assert_eq!(names(page), vec!["a/1", "a/2"]);
        let (page, _) = store
            .list_page("/configmaps", None, Some(("a", "2")), Some(2))
            .unwrap();
        assert_eq!(names(page), vec!["b/1", "c/0"]);
        let (page, _) = store
            .list_page("/configmaps", Some("a"), Some(("a", "1")), None)
            .unwrap();
        assert_eq!(names(page), vec!["a/2"]);
        assert!(store.list("/secrets", None, None).unwrap().0.is_empty());
    }

    #[test]
    fn history_is_bounded() {
        let mut store = Store::open(None).unwrap();
        store.history = 10;
        for i in 0..1000 {
            store
                .create(&key(&format!("o{i}")), json!({"metadata": {}}))
                .unwrap();
        }
        assert_eq!(
            store.changes_since("/configmaps", 5).unwrap().unwrap_err(),
            991
        );
        assert_eq!(
            store
                .changes_since("/configmaps", 995)
                .unwrap()
                .unwrap()
                .len(),
            5
        );
    }
}
