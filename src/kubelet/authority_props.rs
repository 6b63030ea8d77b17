//! Property tests of the `:authority` rewriter over outside bytes: whatever a client sends,
//! in whatever pieces, the rewriter never panics, never holds more than one frame, passes a
//! stream that is not HTTP/2 through unchanged, and stops at the first malformed frame with
//! an error instead of guessing.

use bytes::BytesMut;
use proptest::prelude::*;

use super::*;

/// Feeds `stream` cut at `cuts` (positions, any order) through one rewriter; returns the
/// output and the first error.
fn run(stream: &[u8], cuts: &[usize]) -> (Vec<u8>, Option<AuthorityRewriteError>, usize) {
    feed(&mut ClientStreamRewriter::new(), stream, cuts)
}

/// Feeds `stream` cut at `cuts` through `rewriter`, then once more with no new input (which
/// must emit nothing); returns the output, the first error and the most bytes held back.
fn feed(
    rewriter: &mut ClientStreamRewriter,
    stream: &[u8],
    cuts: &[usize],
) -> (Vec<u8>, Option<AuthorityRewriteError>, usize) {
    let mut cuts: Vec<usize> = cuts.iter().map(|c| c % (stream.len() + 1)).collect();
    cuts.push(stream.len());
    cuts.sort_unstable();
    let (mut input, mut output) = (BytesMut::new(), BytesMut::new());
    let mut start = 0;
    let mut most_buffered = 0;
    for end in cuts {
        input.extend_from_slice(&stream[start..end]);
        start = end;
        if let Err(err) = rewriter.process(&mut input, &mut output) {
            return (output.to_vec(), Some(err), most_buffered);
        }
        most_buffered = most_buffered.max(input.len());
    }
    let (held, emitted) = (input.len(), output.len());
    rewriter.process(&mut input, &mut output).expect("no new input, no new error");
    assert_eq!((input.len(), output.len()), (held, emitted), "progress without input");
    (output.to_vec(), None, most_buffered)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn a_stream_without_the_preface_passes_through_unchanged(
        stream in proptest::collection::vec(any::<u8>(), 0..2048),
        cuts in proptest::collection::vec(any::<usize>(), 0..8),
    ) {
        prop_assume!(!stream.is_empty() && !PREFACE.starts_with(&stream[..stream.len().min(PREFACE.len())]));
        let (output, error, _) = run(&stream, &cuts);
        prop_assert!(error.is_none());
        prop_assert_eq!(output, stream);
    }

    #[test]
    fn arbitrary_frames_after_the_preface_never_panic_and_buffer_at_most_one_frame(
        frames in proptest::collection::vec(
            (any::<u8>(), any::<u8>(), any::<u32>(), proptest::collection::vec(any::<u8>(), 0..600)),
            0..12,
        ),
        cuts in proptest::collection::vec(any::<usize>(), 0..16),
    ) {
        let mut stream = PREFACE.to_vec();
        for (kind, flags, stream_id, payload) in &frames {
            let len = u32::try_from(payload.len()).unwrap();
            stream.extend_from_slice(&len.to_be_bytes()[1..]);
            stream.extend_from_slice(&[*kind % 12, *flags]);
            stream.extend_from_slice(&(stream_id & 0x7fff_ffff).to_be_bytes());
            stream.extend_from_slice(payload);
        }
        let (output, error, most_buffered) = run(&stream, &cuts);
        // Held back after each call: at most the one incomplete frame.
        let largest = frames.iter().map(|f| f.3.len() + 9).max().unwrap_or(0).max(9);
        prop_assert!(most_buffered <= largest, "buffered {most_buffered}, largest frame {largest}");
        if let Some(err) = error {
            prop_assert!(!err.to_string().is_empty());
        } else {
            prop_assert!(output.starts_with(PREFACE));
        }
    }
}

/// Fuzz-style properties on stable Rust (no cargo-fuzz): generated kubelet-like requests,
/// encoded the ways an HPACK encoder may (Huffman or not, indexed or not, table references,
/// size updates), framed the ways RFC 9113 allows (CONTINUATIONs, padding, priority), cut at
/// random points, then mutated. The oracle is h2's own server (the one under tonic), fed
/// once with the rewriter's output and once with the client's bytes unchanged: the headers
/// it decodes must agree, apart from `:authority`. The seed and case count are fixed so the
/// run is the same in CI each time and takes seconds.
mod fuzz {
    use std::collections::BTreeMap;

    use futures::FutureExt as _;
    use httlib_hpack::Encoder;
    use proptest::prelude::*;
    use proptest::test_runner::{Config, RngSeed};
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    use super::feed;
    use crate::kubelet::authority::*;

    /// One client request as the test means it: pseudo-headers, then regular fields.
    #[derive(Debug, Clone)]
    struct Request {
        method: &'static str,
        path: String,
        authority: Option<String>,
        fields: Vec<(String, String)>,
        /// Whether END_STREAM is on HEADERS (else a DATA frame ends the stream).
        end_on_headers: bool,
    }

    impl Request {
        /// The header list in wire order, with `authority` in place of the request's own.
        fn header_list(&self, authority: Option<&str>) -> Vec<(Vec<u8>, Vec<u8>)> {
            let mut list = vec![
                (b":method".to_vec(), self.method.as_bytes().to_vec()),
                (b":scheme".to_vec(), b"http".to_vec()),
                (b":path".to_vec(), self.path.as_bytes().to_vec()),
            ];
            if let Some(authority) = authority {
                list.push((b":authority".to_vec(), authority.as_bytes().to_vec()));
            }
            list.extend(
                self.fields.iter().map(|(n, v)| (n.as_bytes().to_vec(), v.as_bytes().to_vec())),
            );
            list
        }
    }

    fn authority() -> impl Strategy<Value = Option<String>> {
        prop_oneof![
            1 => Just(None),
            3 => Just(Some("%2Fvar%2Flib%2Fkubelet%2Fplugins_registry%2Fnetclaim.dev-reg.sock".to_owned())),
            2 => Just(Some("/var/lib/kubelet/plugins/netclaim.dev/dra.sock".to_owned())),
            2 => Just(Some("localhost".to_owned())),
            1 => Just(Some("[::1]:50051".to_owned())),
            3 => "[a-z0-9.%/:@\\[\\]-]{0,40}".prop_map(Some),
        ]
    }

    fn field() -> impl Strategy<Value = (String, String)> {
        prop_oneof![
            Just(("content-type".to_owned(), "application/grpc".to_owned())),
            Just(("user-agent".to_owned(), "grpc-go/1.64.0".to_owned())),
            Just(("te".to_owned(), "trailers".to_owned())),
            "[0-9]{1,8}[unmSM]".prop_map(|v| ("grpc-timeout".to_owned(), v)),
            ("x-[a-z0-9-]{0,12}", "[ -~]{0,80}"),
            ("x-big", "[a-z]{1000,3000}"),
        ]
    }

    fn request() -> impl Strategy<Value = Request> {
        (
            prop_oneof![Just("POST"), Just("GET"), Just("PUT")],
            "/[A-Za-z0-9._/-]{0,60}",
            authority(),
            proptest::collection::vec(field(), 0..8),
            any::<bool>(),
        )
            .prop_map(|(method, path, authority, fields, end_on_headers)| Request {
                method,
                path,
                authority,
                fields,
                end_on_headers,
            })
    }

    /// Deterministic choices for encoding and framing, from a proptest-chosen seed.
    struct Choices(fastrand::Rng);

    impl Choices {
        fn below(&mut self, n: usize) -> usize {
            self.0.usize(..n.max(1))
        }
    }

    fn frame(out: &mut Vec<u8>, frame_type: u8, flags: u8, stream_id: u32, payload: &[u8]) {
        let len = u32::try_from(payload.len()).expect("test frames are small");
        out.extend_from_slice(&len.to_be_bytes()[1..]);
        out.extend_from_slice(&[frame_type, flags]);
        out.extend_from_slice(&stream_id.to_be_bytes());
        out.extend_from_slice(payload);
    }

    /// Encodes one header list the ways a client encoder may.
    fn encode_block(
        encoder: &mut Encoder<'_>,
        list: &[(Vec<u8>, Vec<u8>)],
        choices: &mut Choices,
    ) -> Vec<u8> {
        let mut block = Vec::new();
        if choices.below(5) == 0 {
            let size = u32::try_from(choices.below(4097)).expect("at most 4096");
            encoder.update_max_dynamic_size(size, &mut block).expect("size within the limit");
        }
        for (name, value) in list {
            let flags = [
                Encoder::HUFFMAN_NAME
                    | Encoder::HUFFMAN_VALUE
                    | Encoder::WITH_INDEXING
                    | Encoder::BEST_FORMAT,
                Encoder::HUFFMAN_VALUE | Encoder::BEST_FORMAT,
                Encoder::HUFFMAN_NAME | Encoder::NEVER_INDEXED,
                Encoder::WITH_INDEXING,
                0,
            ][choices.below(5)];
            encoder.encode((name.clone(), value.clone(), flags), &mut block).expect("encodable");
        }
        block
    }

    /// HEADERS (maybe padded, maybe with priority) and CONTINUATIONs at random split points.
    fn frame_block(
        out: &mut Vec<u8>,
        block: &[u8],
        stream_id: u32,
        end_stream: bool,
        choices: &mut Choices,
    ) {
        let first_len = block.len().min(choices.below(block.len() + 1));
        let (first, mut rest) = block.split_at(first_len);
        let mut flags = if end_stream { FLAG_END_STREAM } else { 0 };
        if rest.is_empty() {
            flags |= FLAG_END_HEADERS;
        }
        let mut payload = Vec::new();
        let pad = u8::try_from(choices.below(3) * choices.below(40)).expect("below 80");
        if pad > 0 {
            flags |= FLAG_PADDED;
            payload.push(pad);
        }
        if choices.below(3) == 0 {
            flags |= FLAG_PRIORITY;
            // Depends on stream 0 (never on itself: h2 refuses that).
            payload.extend_from_slice(&[0, 0, 0, 0, u8::try_from(choices.below(256)).unwrap_or(0)]);
        }
        payload.extend_from_slice(first);
        payload.resize(payload.len() + usize::from(pad), 0);
        frame(out, FRAME_HEADERS, flags, stream_id, &payload);
        while !rest.is_empty() {
            let (chunk, tail) = rest.split_at(rest.len().min(1 + choices.below(600)));
            let end = if tail.is_empty() { FLAG_END_HEADERS } else { 0 };
            frame(out, FRAME_CONTINUATION, end, stream_id, chunk);
            rest = tail;
        }
    }

    /// A client connection: preface, SETTINGS, then each request's frames, with PING and
    /// WINDOW_UPDATE frames between them. `mutate` may change each encoded block before it
    /// is framed (the frames stay well-formed). Returns the bytes and the blocks as sent.
    fn connection(
        requests: &[Request],
        seed: u64,
        mut mutate: impl FnMut(usize, &mut Vec<u8>),
    ) -> Vec<u8> {
        let mut choices = Choices(fastrand::Rng::with_seed(seed));
        let mut encoder = Encoder::default();
        let mut out = PREFACE.to_vec();
        frame(&mut out, 0x4, 0, 0, &[]);
        for (i, request) in requests.iter().enumerate() {
            let stream_id = 2 * u32::try_from(i).expect("few requests") + 1;
            let list = request.header_list(request.authority.as_deref());
            let mut block = encode_block(&mut encoder, &list, &mut choices);
            mutate(i, &mut block);
            frame_block(&mut out, &block, stream_id, request.end_on_headers, &mut choices);
            if !request.end_on_headers {
                frame(&mut out, 0x0, FLAG_END_STREAM, stream_id, &[0, 0, 0, 0, 1, 7]);
            }
            match choices.below(4) {
                0 => frame(&mut out, 0x6, 0, 0, &[1, 2, 3, 4, 5, 6, 7, 8]),
                1 => frame(&mut out, 0x8, 0, 0, &[0, 0, 1, 0]),
                _ => {}
            }
        }
        out
    }

    /// What h2's server decoded from one request: method, path, authority, and the regular
    /// fields (sorted by name, in arrival order per name).
    type Seen = (String, String, Option<String>, Vec<(String, Vec<u8>)>);

    /// PING payload that marks the end of a test connection.
    const SENTINEL: &[u8; 8] = b"fuzzdone";

    /// What h2's server makes of `bytes` (whole frames) from a client: the requests it
    /// accepted by stream id, and the error it ended the connection with (GOAWAY), if any.
    /// A PING follows the bytes; once h2 acknowledges it, it has read everything before it.
    /// (Closing the client instead would make h2 drop the requests not yet accepted.)
    fn h2_server(bytes: &[u8]) -> (BTreeMap<u32, Seen>, Option<h2::Reason>) {
        let runtime = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
        runtime.block_on(async {
            // Room for everything both sides write.
            let (client, server) = tokio::io::duplex(bytes.len() + (1 << 20));
            let (mut from_server, mut to_server) = tokio::io::split(client);
            let mut sent = bytes.to_vec();
            frame(&mut sent, 0x6, 0, 0, SENTINEL);
            to_server.write_all(&sent).await.expect("fits the duplex buffer");
            let mut ack = vec![0, 0, 8, 0x6, 0x1, 0, 0, 0, 0];
            ack.extend_from_slice(SENTINEL);

            let mut seen = BTreeMap::new();
            let mut connection = match h2::server::handshake(server).await {
                Ok(connection) => connection,
                Err(err) => return (seen, err.is_go_away().then(|| err.reason()).flatten()),
            };
            let mut answers = Vec::new();
            let mut acked = false;
            loop {
                let accepted = if acked {
                    // Everything was read: take what is queued, do not wait for more.
                    match connection.accept().now_or_never() {
                        Some(accepted) => accepted,
                        None => break,
                    }
                } else {
                    tokio::select! {
                        accepted = connection.accept() => accepted,
                        read = from_server.read_buf(&mut answers) => {
                            let closed = read.map_or(true, |n| n == 0);
                            acked = answers.windows(ack.len()).any(|w| w == ack);
                            if closed && !acked {
                                break;
                            }
                            continue;
                        }
                    }
                };
                match accepted {
                    None => break,
                    Some(Ok((request, respond))) => {
                        let (parts, _) = request.into_parts();
                        let mut fields: Vec<(String, Vec<u8>)> = parts
                            .headers
                            .iter()
                            .map(|(n, v)| (n.as_str().to_owned(), v.as_bytes().to_vec()))
                            .collect();
                        fields.sort_by(|a, b| a.0.cmp(&b.0));
                        let uri = parts.uri;
                        seen.insert(
                            respond.stream_id().as_u32(),
                            (
                                parts.method.to_string(),
                                uri.path().to_owned(),
                                uri.authority().map(ToString::to_string),
                                fields,
                            ),
                        );
                    }
                    Some(Err(err)) => {
                        return (seen, err.is_go_away().then(|| err.reason()).flatten());
                    }
                }
            }
            (seen, None)
        })
    }

    /// Feeds `stream` through one rewriter in pieces cut at `cuts`; returns the output, the
    /// first error and how many authorities were replaced.
    fn rewrite(stream: &[u8], cuts: &[usize]) -> (Vec<u8>, Option<AuthorityRewriteError>, u64) {
        let mut rewriter = ClientStreamRewriter::new();
        let (output, error, most_buffered) = feed(&mut rewriter, stream, cuts);
        assert!(
            most_buffered <= FRAME_HEADER_LEN + MAX_HEADER_BLOCK,
            "held back {most_buffered} bytes, more than one header frame"
        );
        (output, error, rewriter.rewritten_authorities())
    }

    /// Every byte sequence the rewriter emits parses as frames whose header blocks a fresh
    /// decoder reads without a table (all fields literal, never indexed).
    fn assert_output_is_self_contained(output: &[u8]) {
        let Some(mut rest) = output.strip_prefix(PREFACE) else {
            return; // not HTTP/2: passed through as is
        };
        let mut block = Vec::new();
        while rest.len() >= FRAME_HEADER_LEN {
            let len = usize::from(rest[0]) << 16 | usize::from(rest[1]) << 8 | usize::from(rest[2]);
            let (frame_type, flags) = (rest[3], rest[4]);
            if frame_type != FRAME_HEADERS && frame_type != FRAME_CONTINUATION {
                rest = &rest[(FRAME_HEADER_LEN + len).min(rest.len())..];
                continue;
            }
            assert!(len <= MAX_EMITTED_PAYLOAD, "header frame of {len} bytes");
            let payload = &rest[FRAME_HEADER_LEN..FRAME_HEADER_LEN + len];
            assert_eq!(flags & FLAG_PADDED, 0);
            let skip =
                if frame_type == FRAME_HEADERS && flags & FLAG_PRIORITY != 0 { 5 } else { 0 };
            block.extend_from_slice(&payload[skip..]);
            if flags & FLAG_END_HEADERS != 0 {
                let mut fields = Vec::new();
                httlib_hpack::Decoder::with_dynamic_size(0)
                    .decode(&mut block, &mut fields)
                    .expect("the rewriter's blocks decode without a table");
                assert!(fields.iter().all(|f| f.2 == httlib_hpack::Decoder::NEVER_INDEXED));
                block.clear();
            }
            rest = &rest[FRAME_HEADER_LEN + len..];
        }
    }

    fn config(cases: u32) -> Config {
        Config {
            cases,
            rng_seed: RngSeed::Fixed(0x6b75_6265),
            failure_persistence: None,
            ..Config::default()
        }
    }

    /// What the server must see for `request` behind the rewriter.
    fn expected(request: &Request) -> Seen {
        let authority = request.authority.as_deref().map(|a| {
            if is_acceptable_authority(a.as_bytes()) {
                a.to_owned()
            } else {
                "localhost".to_owned()
            }
        });
        let mut fields: Vec<(String, Vec<u8>)> =
            request.fields.iter().map(|(n, v)| (n.clone(), v.as_bytes().to_vec())).collect();
        fields.sort_by(|a, b| a.0.cmp(&b.0));
        (request.method.to_owned(), request.path.clone(), authority, fields)
    }

    proptest! {
        #![proptest_config(config(128))]

        /// Valid input: h2's server gets every request with the same method, path and fields
        /// (same order per name), and `:authority` changed only where `http` rejects it.
        #[test]
        fn valid_connections_reach_h2_with_only_the_authority_changed(
            requests in proptest::collection::vec(request(), 1..6),
            seed in any::<u64>(),
            cuts in proptest::collection::vec(any::<usize>(), 0..10),
        ) {
            let stream = connection(&requests, seed, |_, _| {});
            let (output, error, rewritten) = rewrite(&stream, &cuts);
            prop_assert!(error.is_none(), "{error:?}");
            assert_output_is_self_contained(&output);
            let (seen, connection_error) = h2_server(&output);
            prop_assert_eq!(connection_error, None);
            let expected: BTreeMap<u32, Seen> = (1..)
                .step_by(2)
                .zip(requests.iter().map(expected))
                .collect();
            prop_assert_eq!(seen, expected);
            let unacceptable = requests
                .iter()
                .filter_map(|r| r.authority.as_deref())
                .filter(|a| !is_acceptable_authority(a.as_bytes()))
                .count();
            prop_assert_eq!(rewritten, u64::try_from(unacceptable).expect("few requests"));
        }

        /// Mutated header blocks inside well-formed frames: the rewriter never panics and
        /// never stalls; what it emits is self-contained HPACK; h2 behind it sees the same
        /// requests as h2 fed the client's bytes directly (authorities aside), and the
        /// rewriter refuses no block that h2 itself decodes.
        #[test]
        fn mutated_blocks_are_refused_or_passed_as_h2_reads_them(
            requests in proptest::collection::vec(request(), 1..4),
            seed in any::<u64>(),
            mutations in proptest::collection::vec((0usize..4, 0u8..7, any::<usize>(), any::<u8>()), 1..4),
            cuts in proptest::collection::vec(any::<usize>(), 0..6),
        ) {
            let stream = connection(&requests, seed, |index, block| {
                for &(target, kind, at, byte) in &mutations {
                    if target % requests.len() != index {
                        continue;
                    }
                    let at = at % (block.len() + 1);
                    match kind {
                        0 if at < block.len() => block[at] ^= 1 << (byte % 8),
                        1 if at < block.len() => block[at] = byte,
                        2 => block.insert(at, byte),
                        3 if at < block.len() => { block.remove(at); }
                        4 => block.truncate(at),
                        // The last byte usually ends a Huffman string: its padding bits.
                        5 if !block.is_empty() => {
                            let last = block.len() - 1;
                            block[last] ^= 1 << (byte % 8);
                        }
                        _ => block.extend(std::iter::repeat_n(byte, usize::from(byte % 9))),
                    }
                }
            });
            let (output, error, rewritten) = rewrite(&stream, &cuts);
            assert_output_is_self_contained(&output);
            let (behind, behind_error) = h2_server(&output);
            let (direct, direct_error) = h2_server(&stream);
            if let Some(AuthorityRewriteError::Hpack { stream_id, .. }) = &error {
                // h2 would have ended the connection at this block too.
                prop_assert!(direct_error.is_some() && !direct.contains_key(stream_id),
                    "the rewriter refused a block h2 decodes: {error:?}; h2 accepted {direct:?}");
            }
            // A request h2 accepts directly reaches it behind the rewriter with the same
            // method, path and fields (the rewriter stops at its first error, so only the
            // streams before that count).
            let last_rewritten = behind.keys().next_back().copied().unwrap_or(0);
            for (stream_id, (method, path, authority, fields)) in &direct {
                if *stream_id > last_rewritten && error.is_some() {
                    continue;
                }
                let Some(seen) = behind.get(stream_id) else {
                    return Err(TestCaseError::fail(format!(
                        "stream {stream_id} accepted directly, lost behind the rewriter"
                    )));
                };
                prop_assert_eq!((&seen.0, &seen.1, &seen.3), (method, path, fields));
                prop_assert_eq!(seen.2.as_ref(), authority.as_ref());
            }
            if error.is_none() {
                // h2 must reach the same verdict on the connection behind the rewriter as on
                // the client's own bytes: a block h2 refuses must not become acceptable by
                // being decoded leniently and re-encoded. (A repaired authority only changes
                // a stream: h2 resets a stream whose authority it cannot parse.)
                prop_assert_eq!(behind_error.is_some(), direct_error.is_some(),
                    "behind {:?} direct {:?}", behind_error, direct_error);
                if rewritten == 0 {
                    prop_assert_eq!(behind.keys().collect::<Vec<_>>(), direct.keys().collect::<Vec<_>>());
                }
            }
        }
    }
}
