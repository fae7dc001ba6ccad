//! A file system in front of another that runs two threads' operations in strict turns: one
//! operation of the first, one of the second, and so on until either is done. A backend that
//! checks for a name and then takes it, in two operations, loses that race here every time,
//! where threads left to the scheduler would hit the window only by luck.

use std::ffi::OsString;
use std::io;
use std::path::Path;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::{self, ThreadId};
use std::time::Duration;

use weightbay::backend_kit::{EntryKind, FileHandle, FileSystem, HeldDir};

/// How long an operation waits for the other thread's before the case gives up on it.
const PATIENCE: Duration = Duration::from_secs(60);

#[derive(Debug, Default)]
struct Turns {
    /// The two threads that take turns; any other thread's operations run at once.
    players: [Option<ThreadId>; 2],
    /// Whose operation runs next.
    next: usize,
    /// Players whose work has returned: the other one no longer waits for them.
    finished: [bool; 2],
}

/// A file system whose operations, made by the two threads of [`Lockstep::play`], alternate.
#[derive(Debug)]
pub(crate) struct Lockstep {
    inner: Arc<dyn FileSystem>,
    turns: Mutex<Turns>,
    changed: Condvar,
}

impl Lockstep {
    pub(crate) fn new(inner: Arc<dyn FileSystem>) -> Arc<Self> {
        Arc::new(Self {
            inner,
            turns: Mutex::default(),
            changed: Condvar::new(),
        })
    }

    /// Runs `zero` and `one` on two threads whose file-system operations alternate, player
    /// `first` (0 or 1) going first, and returns what each returned.
    pub(crate) fn play<A: Send, B: Send>(
        &self,
        first: usize,
        zero: impl FnOnce() -> A + Send,
        one: impl FnOnce() -> B + Send,
    ) -> (A, B) {
        *self.lock() = Turns {
            next: first,
            ..Turns::default()
        };
        thread::scope(|scope| {
            let zero = scope.spawn(|| self.as_player(0, zero));
            let one = scope.spawn(|| self.as_player(1, one));
            (joined(zero), joined(one))
        })
    }

    fn as_player<T>(&self, player: usize, work: impl FnOnce() -> T) -> T {
        self.lock().players[player] = Some(thread::current().id());
        let result = work();
        self.lock().finished[player] = true;
        self.changed.notify_all();
        result
    }

    fn lock(&self) -> MutexGuard<'_, Turns> {
        self.turns.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs `operation` in the calling player's turn and hands the turn to the other.
    fn step<T>(&self, operation: impl FnOnce() -> io::Result<T>) -> io::Result<T> {
        let me = thread::current().id();
        let mut turns = self.lock();
        let Some(player) = turns.players.iter().position(|p| *p == Some(me)) else {
            drop(turns);
            return operation();
        };
        let other = 1 - player;
        while turns.next != player && !turns.finished[other] {
            let (next, timeout) = self
                .changed
                .wait_timeout(turns, PATIENCE)
                .unwrap_or_else(PoisonError::into_inner);
            turns = next;
            if timeout.timed_out() {
                return Err(io::Error::other(format!(
                    "writer {player}: writer {other} never took its turn"
                )));
            }
        }
        drop(turns);
        let result = operation();
        self.lock().next = other;
        self.changed.notify_all();
        result
    }
}

#[deny(clippy::missing_trait_methods)]
impl FileSystem for Lockstep {
    fn create_new(&self, path: &Path) -> io::Result<Box<dyn FileHandle>> {
        self.step(|| self.inner.create_new(path))
    }
    fn create_truncate(&self, path: &Path) -> io::Result<Box<dyn FileHandle>> {
        self.step(|| self.inner.create_truncate(path))
    }
    fn open(&self, path: &Path) -> io::Result<Box<dyn FileHandle>> {
        self.step(|| self.inner.open(path))
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.step(|| self.inner.rename(from, to))
    }
    fn rename_no_replace(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.step(|| self.inner.rename_no_replace(from, to))
    }
    fn hard_link(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.step(|| self.inner.hard_link(from, to))
    }
    fn remove_file(&self, path: &Path) -> io::Result<()> {
        self.step(|| self.inner.remove_file(path))
    }
    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        self.step(|| self.inner.sync_dir(dir))
    }
    fn remove_file_below(&self, root: &Path, relative: &Path) -> io::Result<()> {
        self.step(|| self.inner.remove_file_below(root, relative))
    }
    fn remove_dir_below(&self, root: &Path, relative: &Path) -> io::Result<()> {
        self.step(|| self.inner.remove_dir_below(root, relative))
    }
    fn list_dir(&self, dir: &Path) -> io::Result<Vec<(OsString, EntryKind)>> {
        self.step(|| self.inner.list_dir(dir))
    }
    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        self.step(|| self.inner.create_dir_all(dir))
    }
    fn hold_dir_below(&self, root: &Path, relative: &Path) -> io::Result<HeldDir> {
        self.step(|| self.inner.hold_dir_below(root, relative))
    }
    fn remove_dir(&self, dir: &Path) -> io::Result<()> {
        self.step(|| self.inner.remove_dir(dir))
    }
    fn copy_permissions(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.step(|| self.inner.copy_permissions(from, to))
    }
}

/// What a player returned; its panic, resumed here.
fn joined<T>(handle: thread::ScopedJoinHandle<'_, T>) -> T {
    handle
        .join()
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
}
