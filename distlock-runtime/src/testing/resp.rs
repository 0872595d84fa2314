//! A small blocking RESP client: the test servers are asked whether they are up, and set up,
//! without a runtime and without a connection kept open.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// How long a reply may keep the client waiting in silence.
const SILENCE: Duration = Duration::from_secs(2);

/// Sends one command in RESP and reads one whole reply (giving up after 2 s of silence).
pub(crate) fn command(port: u16, args: &[&str]) -> std::io::Result<String> {
    let mut replies = commands(port, &[args])?;
    Ok(replies.remove(0))
}

/// Sends `commands` one after the other on one connection, each once the previous one was
/// answered, and returns their raw replies.
pub(crate) fn commands(port: u16, commands: &[&[&str]]) -> std::io::Result<Vec<String>> {
    let mut stream = TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(SILENCE))?;
    let mut replies = Vec::with_capacity(commands.len());
    for args in commands {
        let mut request = format!("*{}\r\n", args.len());
        for arg in *args {
            request.push_str(&format!("${}\r\n{arg}\r\n", arg.len()));
        }
        stream.write_all(request.as_bytes())?;
        let mut reply = Vec::new();
        let mut buf = [0u8; 16 * 1024];
        loop {
            let n = stream.read(&mut buf)?;
            reply.extend_from_slice(&buf[..n]);
            if n == 0 || parse_reply(&reply).is_some() {
                break;
            }
        }
        replies.push(String::from_utf8_lossy(&reply).into_owned());
    }
    Ok(replies)
}

/// Runs one command on `port` and parses its reply; `None` if the server cannot be reached, does
/// not answer within 2 s, or the reply is malformed.
pub(crate) fn query(port: u16, args: &[&str]) -> Option<Reply> {
    let raw = command(port, args).ok()?;
    parse_reply(raw.as_bytes()).map(|(reply, _)| reply)
}

/// One RESP2 reply, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Reply {
    /// `+OK`
    Simple(String),
    /// `-ERR ...`
    Error(String),
    /// `:42`
    Integer(i64),
    /// `$3 foo`, or the nil `$-1`.
    Bulk(Option<String>),
    /// `*2 ...`, or the nil `*-1`.
    Array(Option<Vec<Reply>>),
}

impl Reply {
    /// The text of a simple or bulk string.
    pub(crate) fn text(&self) -> Option<&str> {
        match self {
            Reply::Simple(text) | Reply::Bulk(Some(text)) => Some(text),
            _ => None,
        }
    }

    /// Whether it is `+OK` (or another simple string `ok` names).
    pub(crate) fn is_simple(&self, ok: &str) -> bool {
        matches!(self, Reply::Simple(text) if text == ok)
    }

    /// The elements of an array (none for anything else).
    pub(crate) fn items(&self) -> &[Reply] {
        match self {
            Reply::Array(Some(items)) => items,
            _ => &[],
        }
    }

    /// A flat array of alternating names and values (`SENTINEL MASTER`) as a map.
    pub(crate) fn fields(&self) -> HashMap<String, String> {
        self.items()
            .chunks(2)
            .filter_map(|pair| match pair {
                [name, value] => Some((name.text()?.to_owned(), value.text()?.to_owned())),
                _ => None,
            })
            .collect()
    }

    /// What the reply says, for an error message.
    pub(crate) fn describe(&self) -> String {
        match self {
            Reply::Simple(text) | Reply::Bulk(Some(text)) => text.clone(),
            Reply::Error(message) => format!("error {message}"),
            Reply::Integer(n) => n.to_string(),
            Reply::Bulk(None) | Reply::Array(None) => "nil".to_owned(),
            Reply::Array(Some(items)) => {
                let items: Vec<String> = items.iter().map(Reply::describe).collect();
                format!("[{}]", items.join(", "))
            }
        }
    }
}

/// Parses the reply at the start of `bytes`, with its length in bytes; `None` while it is
/// incomplete. Nested arrays (`CLUSTER SHARDS`, `SENTINEL REPLICAS`) count as complete only once
/// their last element has arrived; a type this parser does not know counts as one line.
pub(crate) fn parse_reply(bytes: &[u8]) -> Option<(Reply, usize)> {
    let line_end = bytes.windows(2).position(|w| w == b"\r\n")?;
    let line = String::from_utf8_lossy(bytes.get(1..line_end).unwrap_or_default()).into_owned();
    let after_line = line_end + 2;
    let reply = match bytes[0] {
        b'-' => Reply::Error(line),
        b':' => Reply::Integer(line.parse().unwrap_or_default()),
        b'$' => match usize::try_from(line.parse::<i64>().unwrap_or(-1)) {
            Err(_) => Reply::Bulk(None),
            Ok(len) => {
                let end = after_line + len;
                if bytes.len() < end + 2 {
                    return None;
                }
                let text = String::from_utf8_lossy(&bytes[after_line..end]).into_owned();
                return Some((Reply::Bulk(Some(text)), end + 2));
            }
        },
        b'*' => match usize::try_from(line.parse::<i64>().unwrap_or(-1)) {
            Err(_) => Reply::Array(None),
            Ok(count) => {
                let mut items = Vec::with_capacity(count);
                let mut at = after_line;
                for _ in 0..count {
                    let (item, len) = parse_reply(&bytes[at..])?;
                    items.push(item);
                    at += len;
                }
                return Some((Reply::Array(Some(items)), at));
            }
        },
        _ => Reply::Simple(line),
    };
    Some((reply, after_line))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nested_replies_are_complete_only_with_their_last_element() {
        let whole = b"*2\r\n*2\r\n$4\r\nname\r\n$1\r\nx\r\n*1\r\n:7\r\n";
        for cut in 0..whole.len() {
            assert_eq!(parse_reply(&whole[..cut]), None, "complete at {cut} bytes");
        }
        let (reply, len) = parse_reply(whole).expect("complete");
        assert_eq!(len, whole.len());
        assert_eq!(reply.items()[0].fields()["name"], "x");
        assert_eq!(reply.items()[1].items(), [Reply::Integer(7)]);
        assert_eq!(parse_reply(b"$-1\r\n"), Some((Reply::Bulk(None), 5)));
        assert_eq!(
            parse_reply(b"\r\n"),
            Some((Reply::Simple(String::new()), 2))
        );
        assert_eq!(
            parse_reply(b"-ERR no\r\n"),
            Some((Reply::Error("ERR no".to_owned()), 9))
        );
    }
}
