//! Pure parts of the replication stream: what the server's CopyData messages say, which of
//! them ring the logical wake-up, and the bytes of our status updates. No I/O, so unit tests cover
//! every rule.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// One CopyData message from the server during START_REPLICATION.
#[derive(Debug, PartialEq, Eq)]
pub enum ServerMessage<'a> {
    /// XLogData ('w'): `start` is the WAL position the payload belongs to; `data` is one
    /// pgoutput message.
    XLogData { start: u64, data: &'a [u8] },
    /// Primary keepalive ('k'): how far the server has sent, and whether it wants an answer
    /// now (it ends the connection after `wal_sender_timeout` without one).
    Keepalive { end: u64, reply_requested: bool },
    /// A kind this client does not know; ignored rather than fatal, so a newer server that
    /// adds one does not break the logical wake-up.
    Other(u8),
}

/// Parses a CopyData payload of the replication stream.
pub fn parse(copy_data: &[u8]) -> Result<ServerMessage<'_>, String> {
    let (&kind, rest) = copy_data.split_first().ok_or("an empty CopyData message")?;
    match kind {
        // 'w', start (8), end (8), send time (8), then the plugin's message.
        b'w' => {
            if rest.len() < 24 {
                return Err(format!("a short XLogData message ({} bytes)", rest.len()));
            }
            Ok(ServerMessage::XLogData {
                start: be_u64(&rest[0..8]),
                data: &rest[24..],
            })
        }
        // 'k', end (8), send time (8), reply requested (1).
        b'k' => {
            if rest.len() < 17 {
                return Err(format!("a short keepalive message ({} bytes)", rest.len()));
            }
            Ok(ServerMessage::Keepalive {
                end: be_u64(&rest[0..8]),
                reply_requested: rest[16] != 0,
            })
        }
        other => Ok(ServerMessage::Other(other)),
    }
}

fn be_u64(bytes: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(bytes);
    u64::from_be_bytes(b)
}

/// Follows pgoutput's messages (protocol version 1) and says when a transaction that
/// inserted rows has committed. The publication holds only the outbox table and publishes
/// only inserts, so any Insert belongs to the outbox; what the rows hold does not matter.
///
/// pgoutput sends a transaction only once it has committed (Begin, changes, Commit in one
/// go), so a rolled-back transaction never appears at all.
#[derive(Debug, Default)]
pub struct Decoder {
    /// An Insert was seen since the last Begin.
    inserted: bool,
}

impl Decoder {
    /// Takes one pgoutput message; true when it is the Commit of a transaction that inserted.
    pub fn ring(&mut self, message: &[u8]) -> bool {
        match message.first() {
            Some(b'B') => {
                self.inserted = false;
                false
            }
            Some(b'I') => {
                self.inserted = true;
                false
            }
            Some(b'C') => std::mem::take(&mut self.inserted),
            // Relation, Type, Origin, and Update/Delete/Truncate of a publication that
            // publishes them: nothing to wake for.
            _ => false,
        }
    }
}

/// A Standby Status Update ('r') confirming `position` as written, flushed and applied: the
/// logical wake-up keeps nothing, so everything received is done with, and the slot may let go of
/// the WAL before it. `reply` asks the server to answer at once (our liveness probe).
pub fn status_update(position: u64, now: SystemTime, reply: bool) -> [u8; 34] {
    let mut out = [0u8; 34];
    out[0] = b'r';
    for i in 0..3 {
        out[1 + 8 * i..9 + 8 * i].copy_from_slice(&position.to_be_bytes());
    }
    out[25..33].copy_from_slice(&pg_epoch_micros(now).to_be_bytes());
    out[33] = u8::from(reply);
    out
}

/// Microseconds since 2000-01-01 UTC, PostgreSQL's timestamp epoch.
fn pg_epoch_micros(now: SystemTime) -> i64 {
    const PG_EPOCH_FROM_UNIX: Duration = Duration::from_secs(946_684_800);
    let since_unix = now.duration_since(UNIX_EPOCH).unwrap_or_default();
    match since_unix.checked_sub(PG_EPOCH_FROM_UNIX) {
        Some(d) => i64::try_from(d.as_micros()).unwrap_or(i64::MAX),
        None => 0,
    }
}

/// An LSN as PostgreSQL writes it (`16/B374D848`), for logs.
pub fn lsn(position: u64) -> String {
    format!("{:X}/{:X}", position >> 32, position & 0xffff_ffff)
}

/// A slot name of this process's own: `<channel>_<pid>_<8 hex>`. The channel is
/// `outbox_relay_<16 hex>`, so the name is lowercase, at most 46 bytes (PostgreSQL allows
/// 63), and made only of the characters slot names may hold. Replicas and restarts of one
/// relay never collide, and an operator sees in pg_replication_slots which table it serves.
pub fn slot_name(channel: &str, pid: u32, random: u32) -> String {
    format!("{channel}_{pid}_{random:08x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn xlogdata(start: u64, message: &[u8]) -> Vec<u8> {
        let mut m = vec![b'w'];
        m.extend(start.to_be_bytes());
        m.extend(u64::MAX.to_be_bytes());
        m.extend(7u64.to_be_bytes());
        m.extend(message);
        m
    }

    #[test]
    fn xlogdata_and_keepalives_are_read_and_unknown_kinds_ignored() {
        let m = xlogdata(0x16_B374_D848, b"C\0rest");
        assert_eq!(
            parse(&m),
            Ok(ServerMessage::XLogData {
                start: 0x16_B374_D848,
                data: b"C\0rest"
            })
        );
        let mut k = vec![b'k'];
        k.extend(42u64.to_be_bytes());
        k.extend(0u64.to_be_bytes());
        k.push(1);
        assert_eq!(
            parse(&k),
            Ok(ServerMessage::Keepalive {
                end: 42,
                reply_requested: true
            })
        );
        *k.last_mut().unwrap() = 0;
        assert_eq!(
            parse(&k),
            Ok(ServerMessage::Keepalive {
                end: 42,
                reply_requested: false
            })
        );
        assert_eq!(parse(b"z123"), Ok(ServerMessage::Other(b'z')));
        assert!(parse(b"").is_err());
        assert!(parse(&k[..10]).is_err());
        assert!(parse(&m[..20]).is_err());
    }

    #[test]
    fn rings_once_per_commit_of_a_transaction_that_inserted() {
        let mut d = Decoder::default();
        let steps: &[(&[u8], bool)] = &[
            (b"Bxyz", false),
            (b"Rrelation", false),
            (b"Irow", false),
            (b"Irow", false),
            (b"Ccommit", true),
            // A transaction with nothing published (PostgreSQL < 15 sends those too).
            (b"B", false),
            (b"C", false),
            // An update when the publication publishes them.
            (b"B", false),
            (b"Urow", false),
            (b"C", false),
            (b"B", false),
            (b"Irow", false),
            (b"C", true),
            (b"", false),
        ];
        for (i, (message, rings)) in steps.iter().enumerate() {
            assert_eq!(d.ring(message), *rings, "step {i}: {message:?}");
        }
    }

    #[test]
    fn status_updates_confirm_the_position_three_times_with_the_clock() {
        let at = UNIX_EPOCH + Duration::from_secs(946_684_800) + Duration::from_micros(1_500_000);
        let m = status_update(0x0102_0304_0506_0708, at, true);
        assert_eq!(m[0], b'r');
        for i in 0..3 {
            assert_eq!(
                &m[1 + 8 * i..9 + 8 * i],
                &[1, 2, 3, 4, 5, 6, 7, 8],
                "write, flush, apply"
            );
        }
        assert_eq!(i64::from_be_bytes(m[25..33].try_into().unwrap()), 1_500_000);
        assert_eq!(m[33], 1);
        assert_eq!(status_update(0, UNIX_EPOCH, false)[33], 0);
    }

    #[test]
    fn lsns_print_like_postgresql() {
        assert_eq!(lsn(0x16_B374_D848), "16/B374D848");
        assert_eq!(lsn(0), "0/0");
    }

    #[test]
    fn slot_names_fit_postgresql_rules() {
        let name = slot_name("outbox_relay_0123456789abcdef", u32::MAX, 0xdead_beef);
        assert_eq!(name, "outbox_relay_0123456789abcdef_4294967295_deadbeef");
        assert!(name.len() <= 63);
        assert!(name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'));
        assert_eq!(slot_name("c", 7, 1), "c_7_00000001");
    }
}
