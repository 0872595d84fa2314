//! How `top` draws its [`Model`]: a pure function of the model and the time.

use std::time::{Duration, Instant};

use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Cell, Paragraph, Row, Table};
use ratatui::Frame;

use super::model::{Column, Model, Status};
use crate::reading::{names, secs, Holder, Lock};

/// Draws the whole screen: a title line, the locks, the elections, a status line and the keys.
pub(crate) fn render(frame: &mut Frame<'_>, model: &Model, now: Instant) {
    let elections = model.elections();
    let election_rows = u16::try_from(elections.len()).unwrap_or(u16::MAX);
    let [title, locks, leaders, status, help] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Min(4),
        Constraint::Length(election_rows.saturating_add(3).min(12)),
        Constraint::Length(1),
        Constraint::Length(1),
    ])
    .areas(frame.area());
    frame.render_widget(title_line(model), title);
    render_locks(frame, locks, model, now);
    render_elections(frame, leaders, model, &elections, now);
    frame.render_widget(status_line(model, now), status);
    frame.render_widget(help_line(model), help);
}

fn title_line(model: &Model) -> Paragraph<'static> {
    let (locks, elections) = model.counts();
    let (column, reverse) = model.sort();
    let (filter, _) = model.filter();
    let mut text = format!(
        "distlock top: {locks} locks held, {elections} elections led; sorted by {}{}",
        column.title().to_lowercase(),
        if reverse { " (reversed)" } else { "" }
    );
    if !filter.is_empty() {
        text.push_str(&format!("; filter {filter:?}"));
    }
    Paragraph::new(text).style(Style::new().add_modifier(Modifier::BOLD))
}

/// The waiters: their count, then who, in arrival order.
fn queue(lock: &Lock) -> String {
    if lock.queued.is_empty() {
        return "0".to_owned();
    }
    let names: Vec<&str> = lock.queued.iter().map(Holder::name).collect();
    format!("{}: {}", lock.queued.len(), names.join(" > "))
}

fn render_locks(frame: &mut Frame<'_>, area: Rect, model: &Model, now: Instant) {
    let (sorted, reverse) = model.sort();
    let mut titles: Vec<Cell<'_>> = Column::ALL
        .iter()
        .map(|&column| {
            let mark = match (column == sorted, reverse) {
                (false, _) => "",
                (true, false) => " ^",
                (true, true) => " v",
            };
            Cell::from(format!("{}{mark}", column.title()))
        })
        .collect();
    titles.extend(["HOLDER", "QUEUE (next first)"].map(Cell::from));
    let header = Row::new(titles).style(Style::new().add_modifier(Modifier::REVERSED));
    let rows = model.locks().into_iter().map(|lock| {
        let row = Row::new([
            lock.key.clone(),
            lock.mode.to_string(),
            lock.holders.to_string(),
            remaining(model, lock, now),
            lock.fencing_token.to_string(),
            lock.queued.len().to_string(),
            holder(lock),
            queue(lock),
        ]);
        marked(row, model, lock, now)
    });
    let widths = [
        Constraint::Fill(2),
        Constraint::Length(10),
        Constraint::Length(9),
        Constraint::Length(10),
        Constraint::Length(18),
        Constraint::Length(9),
        Constraint::Fill(3),
        Constraint::Fill(2),
    ];
    frame.render_widget(table(" locks ", header, rows, widths), area);
}

/// The TTL cell: what is left, counting down; `claim 1.5s` in a hand-off's claim (the
/// recipient's own ttl shows from its first renewal).
fn remaining(model: &Model, lock: &Lock, now: Instant) -> String {
    let left = secs(model.remaining(lock, now));
    if lock.claim {
        format!("claim {left}")
    } else {
        left
    }
}

/// The HOLDER cell: the holders, or `handed to beta (…)` in a hand-off's claim (beta holds it
/// and runs: only its ttl is not known yet).
fn holder(lock: &Lock) -> String {
    if lock.claim {
        format!("handed to {}", names(&lock.owners))
    } else {
        names(&lock.owners)
    }
}

/// A row shown in yellow while its lock's holder changed lately.
fn marked<'a>(row: Row<'a>, model: &Model, lock: &Lock, now: Instant) -> Row<'a> {
    if model.is_changed(&lock.key, now) {
        row.style(Style::new().fg(Color::Yellow).add_modifier(Modifier::BOLD))
    } else {
        row
    }
}

/// A table under a titled rule.
fn table<'a>(
    title: &'a str,
    header: Row<'a>,
    rows: impl IntoIterator<Item = Row<'a>>,
    widths: impl IntoIterator<Item = Constraint>,
) -> Table<'a> {
    Table::new(rows, widths)
        .header(header)
        .block(Block::new().borders(Borders::TOP).title(title))
}

fn render_elections(
    frame: &mut Frame<'_>,
    area: Rect,
    model: &Model,
    elections: &[&Lock],
    now: Instant,
) {
    let header = Row::new([
        "ELECTION",
        "LEADER",
        "TERM",
        "TTL",
        "CANDIDATES (next first)",
    ])
    .style(Style::new().add_modifier(Modifier::REVERSED));
    let rows = elections.iter().map(|lock| {
        let row = Row::new([
            lock.election().unwrap_or_default().to_owned(),
            holder(lock),
            lock.fencing_token.to_string(),
            remaining(model, lock, now),
            queue(lock),
        ]);
        marked(row, model, lock, now)
    });
    let widths = [
        Constraint::Fill(2),
        Constraint::Fill(3),
        Constraint::Length(18),
        Constraint::Length(10),
        Constraint::Fill(3),
    ];
    frame.render_widget(table(" elections ", header, rows, widths), area);
}

fn status_line(model: &Model, now: Instant) -> Paragraph<'static> {
    match model.status() {
        Status::Connecting => Paragraph::new("connecting to Redis..."),
        Status::Live => {
            let age = model.read_at().map_or(Duration::ZERO, |at| now - at);
            let servers = model
                .servers()
                .map(|servers| format!("; {servers}"))
                .unwrap_or_default();
            Paragraph::new(format!("live; read {} ago{servers}", secs(age)))
                .style(Style::new().fg(Color::Green))
        }
        Status::Unavailable { error, since } => Paragraph::new(format!(
            "Redis unavailable for {}, retrying; the rows are from before. {error}",
            secs(now - *since)
        ))
        .style(Style::new().fg(Color::White).bg(Color::Red)),
    }
}

fn help_line(model: &Model) -> Paragraph<'static> {
    let key = |k: &'static str| Span::styled(k, Style::new().add_modifier(Modifier::BOLD));
    let line = match model.filter() {
        (_, Some(typed)) => Line::from(vec![
            key("filter: "),
            Span::raw(format!("{typed}_")),
            Span::raw("   (a glob like order:* or any part of a key; "),
            key("Enter"),
            Span::raw(" applies, "),
            key("Esc"),
            Span::raw(" cancels)"),
        ]),
        (_, None) => Line::from(vec![
            key("q"),
            Span::raw(" quit  "),
            key("s"),
            Span::raw(" sort column  "),
            key("r"),
            Span::raw(" reverse  "),
            key("/"),
            Span::raw(" filter  "),
            key("Esc"),
            Span::raw(" clear filter"),
        ]),
    };
    Paragraph::new(line)
}

#[cfg(test)]
mod tests {
    use ratatui::backend::TestBackend;
    use ratatui::Terminal;

    use distlock_runtime::LockMode;

    use super::*;
    use crate::reading::lock;

    fn screen(model: &Model, now: Instant) -> String {
        let mut terminal = Terminal::new(TestBackend::new(140, 20)).unwrap();
        terminal.draw(|frame| render(frame, model, now)).unwrap();
        let buffer = terminal.backend().buffer();
        let mut text = String::new();
        for y in 0..buffer.area.height {
            for x in 0..buffer.area.width {
                text.push_str(buffer[(x, y)].symbol());
            }
            text.push('\n');
        }
        text
    }

    #[test]
    fn the_screen_shows_each_lock_its_queue_in_order_and_each_leader() {
        let start = Instant::now();
        let mut model = Model::new();
        assert!(screen(&model, start).contains("connecting to Redis"));
        let mut order = lock("order:7", LockMode::Exclusive, &["aaaa1111:alpha"], 1234);
        order.queued = vec![
            lock("x", LockMode::Exclusive, &["bbbb2222:beta"], 0).owners[0].clone(),
            lock("x", LockMode::Shared, &["cccc3333"], 0).owners[0].clone(),
        ];
        let leader = lock("election:cron", LockMode::Exclusive, &["dddd4444:boss"], 99);
        model.refreshed(Ok(vec![order, leader]), start);
        let text = screen(&model, start + Duration::from_millis(500));
        let row = text.lines().find(|l| l.contains("order:7")).unwrap();
        for part in [
            "exclusive",
            "9.5s",
            "1234",
            "alpha (aaaa1111)",
            "2: beta > cccc3333",
        ] {
            assert!(row.contains(part), "{part} in {row}");
        }
        let row = text.lines().find(|l| l.contains("cron")).unwrap();
        assert!(
            row.contains("boss (dddd4444)") && row.contains("99"),
            "{row}"
        );
        let status = text.lines().find(|l| l.contains("live; read")).unwrap();
        assert_eq!(status.trim(), "live; read 0.5s ago", "{text}");
        model.served_by("Valkey 8.1.8 at 127.0.0.1:6379".to_owned());
        let text = screen(&model, start + Duration::from_millis(500));
        assert!(
            text.contains("live; read 0.5s ago; Valkey 8.1.8 at 127.0.0.1:6379"),
            "{text}"
        );
        model.refreshed(Err("connection refused".to_owned()), start);
        let text = screen(&model, start + Duration::from_secs(2));
        assert!(
            text.contains("Redis unavailable for 2.0s, retrying; the rows are from before. connection refused"),
            "{text}"
        );
    }

    #[test]
    fn a_lock_in_a_hand_offs_claim_shows_the_claim_and_who_it_is_handed_to() {
        let start = Instant::now();
        let mut model = Model::new();
        let plain = lock("order:1", LockMode::Exclusive, &["aaaa1111:alpha"], 7);
        let mut handed = lock("order:2", LockMode::Exclusive, &["bbbb2222:beta"], 8);
        handed.claim = true;
        handed.remaining = Duration::from_millis(2_000);
        let mut leader = lock("election:cron", LockMode::Exclusive, &["cccc3333:boss"], 9);
        leader.claim = true;
        model.refreshed(Ok(vec![plain, handed, leader]), start);
        let text = screen(&model, start + Duration::from_millis(500));
        let row = text.lines().find(|l| l.contains("order:2")).unwrap();
        for part in ["claim 1.5s", "handed to beta (bbbb2222)"] {
            assert!(row.contains(part), "{part} in {row}");
        }
        let row = text.lines().find(|l| l.contains("order:1")).unwrap();
        assert!(row.contains(" 9.5s "), "{row}");
        assert!(!row.contains("claim") && !row.contains("handed"), "{row}");
        let row = text.lines().find(|l| l.contains("cron")).unwrap();
        for part in ["claim 9.5s", "handed to boss (cccc3333)"] {
            assert!(row.contains(part), "{part} in {row}");
        }
    }
}
