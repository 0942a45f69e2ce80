//! HTTP/2 written frame by frame on the socket: a request without
//! `:authority` at all (allowed when the target has no authority, as a unix
//! socket's has not), a header block that cannot be decoded, and a Sync
//! stream of one small DATA frame per message that the server does not read
//! for a while. grpcurl (tests/grpcurl.rs) and grpcio (tests/grpcio.rs)
//! cover the socket path and its %-encoding.

mod support;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use prost::Message;
use support::Daemon;
use tokio::sync::{mpsc, oneshot};
use vxmgr::calc_source::EngineInput;
use vxmgr::calc_source::recorder::Recorder;
use vxmgr::server::{DataplaneService, RESPONSE_BUFFER, serve};
use vxmgr::wire::felix::ToDataplane;

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = (payload.len() as u32).to_be_bytes()[1..].to_vec();
    out.extend_from_slice(&[kind, flags]);
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// Literal header fields without indexing, raw strings shorter than 127 bytes.
fn header_block(fields: &[(&str, &str)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, value) in fields {
        out.push(0x00);
        for s in [name, value] {
            out.push(s.len() as u8);
            out.extend_from_slice(s.as_bytes());
        }
    }
    out
}

/// Connects, sends the preface, SETTINGS and `frames`.
fn connect(socket: &Path, frames: &[Vec<u8>]) -> UnixStream {
    let mut conn = UnixStream::connect(socket).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut bytes = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    bytes.extend(frame(0x4, 0, 0, &[]));
    for f in frames {
        bytes.extend_from_slice(f);
    }
    conn.write_all(&bytes).unwrap();
    conn
}

/// Reads frames until one of type `kind` on `stream`; its payload.
fn next_frame(conn: &mut UnixStream, kind: u8, stream: u32) -> Vec<u8> {
    loop {
        let mut header = [0u8; 9];
        conn.read_exact(&mut header)
            .expect("a frame from the server");
        let len = u32::from_be_bytes([0, header[0], header[1], header[2]]) as usize;
        let mut payload = vec![0; len];
        conn.read_exact(&mut payload).unwrap();
        let on = u32::from_be_bytes([header[5], header[6], header[7], header[8]]);
        match header[3] {
            k if k == kind && on == stream => return payload,
            0x3 if on == stream => panic!("stream reset: {payload:?}"),
            0x7 => panic!("GOAWAY: {payload:?}"),
            _ => {}
        }
    }
}

#[test]
fn a_request_without_authority_is_served() {
    let daemon = Daemon::memory(&[]);
    let block = header_block(&[
        (":method", "POST"),
        (":scheme", "http"),
        (":path", "/grpc.health.v1.Health/Check"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ]);
    let mut conn = connect(
        &daemon.socket,
        &[
            frame(0x1, 0x4, 1, &block), // HEADERS, END_HEADERS
            // An empty HealthCheckRequest (the server as a whole), END_STREAM.
            frame(0x0, 0x1, 1, &[0, 0, 0, 0, 0]),
        ],
    );
    // HealthCheckResponse { status: SERVING }
    assert_eq!(next_frame(&mut conn, 0x0, 1), [0, 0, 0, 0, 2, 0x08, 0x01]);
}

#[test]
fn an_undecodable_header_block_ends_its_connection_with_a_goaway() {
    let daemon = Daemon::memory(&[]);
    // An indexed field past the end of both tables.
    let mut conn = connect(&daemon.socket, &[frame(0x1, 0x4, 1, &[0xff, 0x7f])]);
    let goaway = next_frame(&mut conn, 0x7, 0);
    let error_code = u32::from_be_bytes(goaway[4..8].try_into().unwrap());
    assert_eq!(error_code, 0x1, "PROTOCOL_ERROR");
    // The daemon goes on serving, and a socket path as :authority is fine.
    let block = header_block(&[
        (":method", "POST"),
        (":scheme", "http"),
        (":authority", "/tmp/vx.sock"),
        (":path", "/grpc.health.v1.Health/Check"),
        ("content-type", "application/grpc"),
    ]);
    let mut conn = connect(
        &daemon.socket,
        &[
            frame(0x1, 0x4, 1, &block),
            frame(0x0, 0x1, 1, &[0, 0, 0, 0, 0]),
        ],
    );
    assert_eq!(next_frame(&mut conn, 0x0, 1), [0, 0, 0, 0, 2, 0x08, 0x01]);
}

/// Felix, grpcio and tonic send a DATA frame per message, and the server
/// stops reading a Sync stream while the manager is busy. The HTTP/2 layer
/// ends a connection whose unread small frames cost too much of its window
/// (GOAWAY ENHANCE_YOUR_CALM): 8,000 frames of 8 bytes did, with the window
/// the server had. They must wait instead, and all reach the manager.
#[test]
fn small_data_frames_wait_while_the_server_does_not_read() {
    const MESSAGES: u64 = 8_000;
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("vx.sock");
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let listener = runtime
        .block_on(async { tokio::net::UnixListener::bind(&socket) })
        .unwrap();
    // Room for the stream's start and nothing more: the stream's reader
    // waits on the first messages it hands over, and reads no further.
    let (engine, mut inputs) = mpsc::channel(1);
    let (queries, _queries) = mpsc::channel(1);
    let service =
        DataplaneService::new(engine, queries, RESPONSE_BUFFER, Recorder::default(), None);
    let (_, health) = tonic_health::server::health_reporter();
    let (stop, stopped) = oneshot::channel::<()>();
    let server = runtime.spawn(serve(listener, Vec::new(), service, health, async {
        let _ = stopped.await;
    }));

    let block = header_block(&[
        (":method", "POST"),
        (":scheme", "http"),
        (":path", "/vxmgr.v1.Dataplane/Sync"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ]);
    let mut frames = vec![frame(0x1, 0x4, 1, &block)];
    for n in 1..=MESSAGES {
        let message = ToDataplane {
            sequence_number: n,
            ..Default::default()
        }
        .encode_to_vec();
        let mut grpc = vec![0];
        grpc.extend_from_slice(&(message.len() as u32).to_be_bytes());
        grpc.extend_from_slice(&message);
        frames.push(frame(0x0, 0, 1, &grpc));
    }
    // Within the initial 65,535-byte windows, sent before the server's
    // SETTINGS are read.
    let payload: usize = frames[1..].iter().map(|f| f.len() - 9).sum();
    assert!(payload < 65_535, "{payload} bytes of DATA");
    // Answered once the server has taken every frame before it.
    let ping = *b"allread!";
    frames.push(frame(0x6, 0, 0, &ping));
    let mut conn = connect(&socket, &frames);
    assert_eq!(next_frame(&mut conn, 0x6, 0), ping);

    let received = runtime.block_on(async {
        let mut received = 0;
        while received < MESSAGES {
            let input = tokio::time::timeout(Duration::from_secs(30), inputs.recv())
                .await
                .expect("messages within 30 s")
                .expect("the server runs");
            if let EngineInput::Messages { messages, .. } = input {
                received += messages.len() as u64;
            }
        }
        received
    });
    assert_eq!(received, MESSAGES);
    drop(conn);
    let _ = stop.send(());
    runtime.block_on(server).unwrap().unwrap();
}
