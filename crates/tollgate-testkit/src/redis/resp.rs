//! Just enough RESP to send one command and read its reply, so tests can
//! inspect or seed a server without a client crate.

use std::io::{self, BufRead, BufReader, Write};
use std::net::TcpStream;
use std::time::Duration;

/// One command in RESP, e.g. `["DEBUG", "SLEEP", "3"]`.
pub(super) fn encode(args: &[&str]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out
}

/// Reads one RESP reply: a simple string, integer or bulk string as its
/// text, an array as its elements one per line, nil as ""; an error reply
/// is an `Err` with its text.
pub(super) fn read_reply(r: &mut impl BufRead) -> io::Result<String> {
    let mut line = String::new();
    if r.read_line(&mut line)? == 0 {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "connection closed",
        ));
    }
    let line = line.trim_end_matches("\r\n");
    let (kind, rest) = line.split_at(line.len().min(1));
    let bad = || io::Error::other(format!("bad reply: {line}"));
    match kind {
        "+" | ":" => Ok(rest.to_owned()),
        "-" => Err(io::Error::other(rest.to_owned())),
        "$" => {
            let Ok(n) = rest.parse::<i64>() else {
                return Err(bad());
            };
            let Ok(n) = usize::try_from(n) else {
                return Ok(String::new()); // $-1: nil
            };
            let mut buf = vec![0; n + 2];
            r.read_exact(&mut buf)?;
            buf.truncate(n);
            Ok(String::from_utf8_lossy(&buf).into_owned())
        }
        "*" => {
            let n = rest.parse::<i64>().map_err(|_| bad())?;
            let mut items = Vec::new();
            for _ in 0..n.max(0) {
                items.push(read_reply(r)?);
            }
            Ok(items.join("\n"))
        }
        _ => Err(bad()),
    }
}

/// Sends one command to the server on `port` and reads its reply, waiting
/// at most `timeout` for it.
pub(super) fn command_on(port: u16, args: &[&str], timeout: Duration) -> io::Result<String> {
    let s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    (&s).write_all(&encode(args))?;
    read_reply(&mut BufReader::new(s))
}
