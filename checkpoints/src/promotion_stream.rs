//! A promotion that follows its save ([`following`](crate::following)): each container the
//! save announces is read back as it is written and streamed into the durable tier's sink,
//! then the committed step is copied with what was streamed, every CRC32C checked against the
//! fast tier's record before the durable record is written.

use std::sync::mpsc::Receiver;

use weightbay::backend_kit::unique_token;
use weightbay::checksum::crc32c_append;
use weightbay::{Durability, Result};

use crate::copy::create_container;
use crate::following::{Followed, Head, Heads};
use crate::layout;
use crate::promoter::Tiers;

/// How much of a followed container is read back and sent at a time.
const FOLLOW_WINDOW: u64 = 8 << 20;

impl Tiers {
    /// Promotes `step` following the fast tier's save of it: streams each container the save
    /// announces on `announced` (the channel closes when the save ends), then copies the
    /// committed step with what was streamed. Returns how it ended and whether it failed
    /// because the save did not commit. It holds the durable tier's save slot throughout, as
    /// a copy does, so gc there leaves its uploads alone and a save or copy made there
    /// directly meanwhile waits for it.
    pub(crate) fn follow(&self, step: u64, announced: Receiver<Followed>) -> (Result<()>, bool) {
        let dir = self.durable.step_dir(step);
        let _in_flight = match self.durable.saves.begin((step, dir.clone())) {
            Ok(in_flight) => in_flight,
            Err(e) => return (Err(e), false),
        };
        let save = unique_token();
        let streamed = self.stream(step, &dir, &save, announced);
        // The channel closed when the save's `write_and_commit` returned, its record written
        // or its failure known; a background save's slot ends just after.
        let (opened, unsaved) = self.saved_on_fast(step);
        let promoted = streamed.and_then(|heads| {
            let checkpoint = opened?;
            self.copy(&checkpoint, Some((&save, heads))).map(drop)
        });
        (promoted, unsaved)
    }

    /// Streams every container announced to directory `save` of `dir` on the durable tier,
    /// until the save ends. The first failure stops the streaming (what it streamed is
    /// dropped, its sinks aborted), but not the save, which it waits for all the same.
    fn stream(
        &self,
        step: u64,
        dir: &str,
        save: &str,
        announced: Receiver<Followed>,
    ) -> Result<Heads> {
        let fast_dir = format!("{}/", self.fast.step_dir(step));
        let mut heads = Heads::new();
        let mut failure = None;
        let mut window = Vec::new();
        for followed in announced {
            let Some(relative) = followed.key.strip_prefix(&fast_dir) else {
                continue;
            };
            if failure.is_some() {
                continue;
            }
            let key = format!("{dir}/{}", layout::moved_into(save, relative));
            match self.stream_one(&followed, &key, &mut window) {
                Ok(Some(head)) => {
                    heads.insert(relative.to_owned(), head);
                }
                Ok(None) => {}
                Err(e) => {
                    // Abort what was streamed now, not when the save ends.
                    heads.clear();
                    failure = Some(e);
                }
            }
        }
        failure.map_or(Ok(heads), Err)
    }

    /// Streams one container to `key` on the durable tier as the save writes it: its head,
    /// or `None` when the save abandoned it.
    fn stream_one(
        &self,
        followed: &Followed,
        key: &str,
        window: &mut Vec<u8>,
    ) -> Result<Option<Head>> {
        let storage = self.durable.storage.as_ref();
        let mut sink = create_container(storage, key, followed.expected_len, Durability::Default)?;
        let (mut len, mut crc) = (0, 0);
        loop {
            let (written, end) = followed.progress.wait_past(len);
            while len < written {
                // At most FOLLOW_WINDOW, so it fits in usize.
                let n = (written - len).min(FOLLOW_WINDOW) as usize;
                window.resize(n, 0);
                followed
                    .reader
                    .read_at(len, window)
                    .map_err(|e| e.context(format!("reading back {}", followed.key)))?;
                sink.write(window)
                    .map_err(|e| e.with_operation("write").with_key(key))?;
                crc = crc32c_append(crc, window);
                len += n as u64;
            }
            match end {
                Some(true) => return Ok(Some(Head { sink, len, crc })),
                Some(false) => return Ok(None),
                None => {}
            }
        }
    }
}
