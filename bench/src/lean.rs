//! A lean RESP2 client for the `ceiling` loop only: XREADGROUP replies are parsed where they are
//! read, straight into entries with owned fields (what the host needs for a delivery), without
//! redis-rs's intermediate `Value` tree or its connection task. A prototype that measures what
//! moving the host's hot read to such a reader would win (`ceiling-lean`); the host does not
//! use it, since it has none of redis-rs's TLS, ACL login, Sentinel or cluster handling.

use anyhow::{Context, Result, bail};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// One stream entry: its id and fields.
pub type LeanEntry = (String, Vec<(Vec<u8>, Vec<u8>)>);

/// A plain TCP connection to Redis speaking RESP2.
pub struct LeanConn {
    tcp: TcpStream,
    buf: Vec<u8>,
    out: Vec<u8>,
}

/// Why a reply could not be parsed yet: more bytes are needed.
struct Incomplete;

/// A cursor over a reply in the read buffer.
struct Cursor<'a> {
    buf: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    /// `<prefix><integer>\r\n`.
    fn int(&mut self, prefix: u8) -> Result<Result<i64, Incomplete>> {
        let Some(end) = self.buf[self.at..].windows(2).position(|w| w == b"\r\n") else {
            return Ok(Err(Incomplete));
        };
        let line = &self.buf[self.at..self.at + end];
        if line.first() != Some(&prefix) {
            bail!(
                "expected '{}' in the reply, got {:?}",
                prefix as char,
                String::from_utf8_lossy(line)
            );
        }
        let n: i64 = std::str::from_utf8(&line[1..])?.parse()?;
        self.at += end + 2;
        Ok(Ok(n))
    }

    /// `$<n>\r\n<n bytes>\r\n`.
    fn bulk(&mut self) -> Result<Result<&'a [u8], Incomplete>> {
        let n = match self.int(b'$')? {
            Ok(n) => usize::try_from(n).context("a nil bulk string where bytes were expected")?,
            Err(incomplete) => return Ok(Err(incomplete)),
        };
        if self.buf.len() < self.at + n + 2 {
            return Ok(Err(Incomplete));
        }
        let bytes = &self.buf[self.at..self.at + n];
        self.at += n + 2;
        Ok(Ok(bytes))
    }
}

/// Unwrap a step of the parser, or report that the reply is incomplete.
macro_rules! step {
    ($e:expr) => {
        match $e? {
            Ok(v) => v,
            Err(Incomplete) => return Ok(None),
        }
    };
}

/// XREADGROUP's reply (nil, or `[[stream, [[id, [field, value, ...]], ...]]]`), if the buffer
/// holds all of it: the entries and how many bytes the reply took.
fn parse_read(buf: &[u8]) -> Result<Option<(Vec<LeanEntry>, usize)>> {
    let mut c = Cursor { buf, at: 0 };
    let streams = step!(c.int(b'*'));
    let mut entries = Vec::new();
    for _ in 0..streams.max(0) {
        step!(c.int(b'*'));
        step!(c.bulk());
        let n = step!(c.int(b'*'));
        entries.reserve(n.max(0) as usize);
        for _ in 0..n.max(0) {
            step!(c.int(b'*'));
            let id = String::from_utf8(step!(c.bulk()).to_vec())?;
            let flat = step!(c.int(b'*'));
            let mut fields = Vec::with_capacity(flat.max(0) as usize / 2);
            for _ in 0..flat.max(0) / 2 {
                let name = step!(c.bulk()).to_vec();
                let value = step!(c.bulk()).to_vec();
                fields.push((name, value));
            }
            entries.push((id, fields));
        }
    }
    Ok(Some((entries, c.at)))
}

impl LeanConn {
    /// Connect to the Redis at `url` (`redis://host:port`, no password).
    pub async fn connect(url: &str) -> Result<Self> {
        let addr = url
            .strip_prefix("redis://")
            .context("a redis:// URL")?
            .trim_end_matches('/');
        let tcp = TcpStream::connect(addr)
            .await
            .with_context(|| format!("connect to {addr}"))?;
        tcp.set_nodelay(true)?;
        Ok(Self {
            tcp,
            buf: Vec::with_capacity(1 << 16),
            out: Vec::with_capacity(1 << 12),
        })
    }

    async fn send(&mut self, args: &[&[u8]]) -> Result<()> {
        self.out.clear();
        self.out
            .extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
        for arg in args {
            self.out
                .extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
            self.out.extend_from_slice(arg);
            self.out.extend_from_slice(b"\r\n");
        }
        self.tcp.write_all(&self.out).await?;
        Ok(())
    }

    async fn read_more(&mut self) -> Result<()> {
        let len = self.buf.len();
        self.buf.resize(len.max(1 << 16) + (1 << 16), 0);
        let n = self.tcp.read(&mut self.buf[len..]).await?;
        self.buf.truncate(len + n);
        if n == 0 {
            bail!("Redis closed the connection");
        }
        Ok(())
    }

    /// XREADGROUP GROUP `group` `consumer` COUNT `count` STREAMS `stream` `>`, no BLOCK.
    pub async fn read_group(
        &mut self,
        group: &str,
        consumer: &str,
        count: usize,
        stream: &str,
    ) -> Result<Vec<LeanEntry>> {
        let count = count.to_string();
        self.send(&[
            b"XREADGROUP",
            b"GROUP",
            group.as_bytes(),
            consumer.as_bytes(),
            b"COUNT",
            count.as_bytes(),
            b"STREAMS",
            stream.as_bytes(),
            b">",
        ])
        .await?;
        loop {
            if self.buf.starts_with(b"-") {
                bail!("Redis: {}", String::from_utf8_lossy(&self.buf));
            }
            if let Some((entries, used)) = parse_read(&self.buf)? {
                self.buf.drain(..used);
                return Ok(entries);
            }
            self.read_more().await?;
        }
    }

    /// XACK `stream` `group` `ids`: how many Redis acknowledged.
    pub async fn ack(&mut self, stream: &str, group: &str, ids: &[String]) -> Result<i64> {
        let mut args: Vec<&[u8]> = vec![b"XACK", stream.as_bytes(), group.as_bytes()];
        args.extend(ids.iter().map(|id| id.as_bytes()));
        self.send(&args).await?;
        loop {
            let mut c = Cursor {
                buf: &self.buf,
                at: 0,
            };
            if let Ok(n) = c.int(b':')? {
                let used = c.at;
                self.buf.drain(..used);
                return Ok(n);
            }
            self.read_more().await?;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_reply_only_when_it_is_whole() {
        let reply = b"*1\r\n*2\r\n$1\r\ns\r\n*2\r\n*2\r\n$3\r\n1-0\r\n*2\r\n$1\r\na\r\n$2\r\nxy\r\n*2\r\n$3\r\n2-0\r\n*0\r\n";
        for cut in 0..reply.len() {
            assert!(parse_read(&reply[..cut]).unwrap().is_none(), "cut at {cut}");
        }
        let (entries, used) = parse_read(reply).unwrap().unwrap();
        assert_eq!(used, reply.len());
        assert_eq!(
            entries,
            vec![
                ("1-0".to_owned(), vec![(b"a".to_vec(), b"xy".to_vec())]),
                ("2-0".to_owned(), vec![])
            ]
        );
        let (none, used) = parse_read(b"*-1\r\n").unwrap().unwrap();
        assert!(none.is_empty());
        assert_eq!(used, 5);
    }
}
