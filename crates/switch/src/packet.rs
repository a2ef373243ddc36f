//! What the switch sees and emits: RDMA requests and responses reduced to
//! the fields SwordBox reads and rewrites (SwordBox §4.1, Fig. 6: the BTH
//! names the connection, sequence number and opcode; the RETH/AtomicETH
//! the virtual address, length and atomic operands). The simulator builds
//! these from work requests; a RoCEv2 parser builds them from packets and
//! writes a [`Forward`] back into the packet it came from.

/// A reliable connection as the switch identifies it (RoCEv2: source and
/// destination IP, source UDP port, destination queue pair), numbered by
/// whoever feeds the switch.
pub type ConnId = u32;

/// A memory node (destination server).
pub type Dest = u16;

/// A request's identity: its incoming connection and sequence number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Token {
    /// The incoming connection.
    pub conn: ConnId,
    /// Its sequence number there.
    pub psn: u64,
}

/// The operation of a request, with the operands the switch may read or
/// rewrite. Addresses are the 64-bit remote addresses the verbs name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verb {
    /// RDMA READ of `len` bytes.
    Read {
        /// Remote address.
        addr: u64,
        /// Bytes.
        len: u32,
    },
    /// RDMA WRITE of `len` bytes; `word` is the payload when it is one
    /// 8-byte word (what a lock release writes), else `None`.
    Write {
        /// Remote address.
        addr: u64,
        /// Bytes.
        len: u32,
        /// The payload of an 8-byte WRITE.
        word: Option<u64>,
    },
    /// Compare-and-swap of the 8-byte word at `addr`.
    Cas {
        /// Remote address.
        addr: u64,
        /// Compare operand.
        compare: u64,
        /// Swap operand.
        swap: u64,
    },
    /// Fetch-and-add of the 8-byte word at `addr`.
    Faa {
        /// Remote address.
        addr: u64,
        /// Addend.
        add: u64,
    },
}

impl Verb {
    /// The remote address the request names.
    pub fn addr(&self) -> u64 {
        match *self {
            Verb::Read { addr, .. }
            | Verb::Write { addr, .. }
            | Verb::Cas { addr, .. }
            | Verb::Faa { addr, .. } => addr,
        }
    }
}

/// A request bound for a memory node, as it reaches the switch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    /// The connection it came on.
    pub conn: ConnId,
    /// Its sequence number on that connection (a parser extends RoCEv2's
    /// 24-bit PSN to 64 bits per connection).
    pub psn: u64,
    /// The memory node it is bound for.
    pub dest: Dest,
    /// What it does.
    pub verb: Verb,
}

impl Request {
    /// Its identity.
    pub fn token(&self) -> Token {
        Token {
            conn: self.conn,
            psn: self.psn,
        }
    }
}

/// What the switch did to a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Forwarded unchanged.
    Pass,
    /// A Clover CAS moved to the key's cached tail (`from`: the address it
    /// named), predicted to succeed.
    SteeredCas {
        /// The address the client named.
        from: u64,
    },
    /// A Clover CAS moved to the key's cached tail, predicted to fail (the
    /// key is not in the state the operation expects); moved so it cannot
    /// succeed on an older version whose successor is still in flight.
    SteeredDoomedCas {
        /// The address the client named.
        from: u64,
    },
    /// A Clover READ moved to the key's last acknowledged version.
    SteeredRead {
        /// The address the client named.
        from: u64,
    },
    /// A CAS on a lock word replaced by an 8-byte WRITE of its outcome.
    CasToWrite {
        /// The lock word's value before (the atomic ACK returns it).
        prior: u64,
    },
    /// Moved onto the destination's shared connection, unchanged.
    Muxed,
    /// A retransmission: forwarded exactly as the original was.
    Retransmission,
}

/// What to send on: the connection, sequence number and (possibly
/// rewritten) operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Forward {
    /// The outgoing connection (the incoming one unless multiplexed).
    pub conn: ConnId,
    /// The sequence number on it.
    pub psn: u64,
    /// The operation to execute.
    pub verb: Verb,
    /// What the switch did.
    pub action: Action,
    /// The response must not reach its client before the response of this
    /// request (ordered completion of steered appends: a client never
    /// learns its version is linked before the versions it was linked
    /// behind are).
    pub after: Option<Token>,
    /// Not to be sent before this instant (the quiet period after a
    /// restart).
    pub not_before: Option<u64>,
}

/// A response on a connection, as it comes back from a memory node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RespKind {
    /// A (possibly coalesced, cumulative) ACK: every request up to `psn`
    /// completed.
    Ack,
    /// The response of an atomic, with the word's old value.
    Atomic {
        /// The old value.
        old: u64,
    },
    /// The response of a READ (its data passes through unchanged).
    Read,
    /// Go-back-N: the server expects `psn` next and dropped what came after.
    Nak,
}

/// A response arriving at the switch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Response {
    /// The connection it came on (the outgoing side of the switch).
    pub conn: ConnId,
    /// The sequence number it names.
    pub psn: u64,
    /// What it says.
    pub kind: RespKind,
}

/// A response the switch sends to a client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Delivery {
    /// The client's connection.
    pub conn: ConnId,
    /// The client's sequence number it names.
    pub psn: u64,
    /// What it says (an atomic ACK for a CAS the switch replaced).
    pub kind: RespKind,
}
