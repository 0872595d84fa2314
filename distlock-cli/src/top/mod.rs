//! `distlock top`: a terminal UI of every held lock (its mode, holders, ttl, fencing token and
//! queued waiters in order) and every election's leader, read again about once a second.
//!
//! The [`model`] holds what is shown and takes keys and readings; the [`view`] draws it; this
//! module only moves events between the terminal, Redis and the model. Keys are read on a thread
//! of their own and readings on a task of their own, so neither a slow Redis nor a quiet
//! keyboard holds the other up: `q` quits at once even while a reading waits on a hung server.

mod model;
mod view;

use std::time::{Duration, Instant};

use distlock_runtime::LockManager;
use ratatui::crossterm::event::{self, Event};
use tokio::sync::mpsc;

use crate::reading::Lock;
use model::{Action, Model};

/// How often the screen is drawn again between readings (the ttl counts down).
const REDRAW: Duration = Duration::from_millis(250);

/// Runs the UI until `q` or Ctrl-C; the terminal is restored on the way out (also on a panic).
/// Fails only when the terminal cannot be used (not a terminal, or its output closed).
pub(crate) async fn run(locks: &LockManager, every: Duration) -> Result<(), String> {
    let mut terminal = ratatui::try_init().map_err(|e| {
        format!("top needs a terminal ({e}); in a script use `distlock list` or `distlock watch`")
    })?;
    let result = show(&mut terminal, locks, every).await;
    ratatui::restore();
    result.map_err(|e| format!("the terminal failed: {e}"))
}

async fn show(
    terminal: &mut ratatui::DefaultTerminal,
    locks: &LockManager,
    every: Duration,
) -> std::io::Result<()> {
    let (key_sender, mut events) = mpsc::unbounded_channel();
    // Blocking reads; the thread ends with the process.
    std::thread::spawn(move || {
        while let Ok(event) = event::read() {
            if key_sender.send(event).is_err() {
                break;
            }
        }
    });
    let (read_sender, mut reads) = mpsc::channel(1);
    let reader = tokio::spawn(read_every(locks.clone(), every, read_sender));
    let mut model = Model::new();
    let mut redraw = tokio::time::interval(REDRAW);
    loop {
        terminal.draw(|frame| view::render(frame, &model, Instant::now()))?;
        tokio::select! {
            event = events.recv() => match event {
                Some(Event::Key(key)) => {
                    if model.key(key) == Action::Quit {
                        break;
                    }
                }
                Some(_) => {}
                None => break,
            },
            Some((read, servers)) = reads.recv() => {
                if let Some(servers) = servers {
                    model.served_by(servers);
                }
                model.refreshed(read, Instant::now());
            }
            _ = redraw.tick() => {}
        }
    }
    reader.abort();
    Ok(())
}

/// One reading: the locks held (or why they could not be read), and which servers answered
/// when that is newly known.
type Reading = (Result<Vec<Lock>, String>, Option<String>);

/// Reads every held lock every `every`, and sends each reading (or why it failed), with which
/// servers answered when that is newly known: at the first reading, and at the first after a
/// failed one (a restart or a failover may bring another version). A reading is bounded by the
/// manager's timeouts per command, and by five readings' time (at least 5 s) in all.
async fn read_every(locks: LockManager, every: Duration, readings: mpsc::Sender<Reading>) {
    let bound = (every * 5).max(Duration::from_secs(5));
    let mut known = false;
    loop {
        let started = Instant::now();
        let read = match tokio::time::timeout(bound, locks.held_locks("*")).await {
            Ok(Ok(held)) => Ok(held.iter().map(Lock::from).collect()),
            Ok(Err(error)) => Err(error.to_string()),
            Err(_) => Err(format!("no answer within {bound:?}")),
        };
        let mut servers = None;
        if read.is_err() {
            known = false;
        } else if !known {
            if let Ok(Ok(answered)) = tokio::time::timeout(bound, locks.servers()).await {
                servers = Some(crate::reading::servers(&answered));
                known = true;
            }
        }
        if readings.send((read, servers)).await.is_err() {
            return;
        }
        tokio::time::sleep(every.saturating_sub(started.elapsed())).await;
    }
}
