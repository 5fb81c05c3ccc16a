//! tokio rsocket streams (feature `tokio`): an echo server task and a client task on one
//! runtime, each with its own device, data verified, then end of stream.
#![cfg(feature = "tokio")]

use softverbs::sock::{AsyncRdmaListener, AsyncRdmaStream, RdmaListener, StreamOptions};
use softverbs::{Config, Device};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[tokio::test]
async fn async_echo_with_end_of_stream() {
    let server_ctx = Device::with_config("sock-async", Config::default())
        .open()
        .unwrap();
    let opts = StreamOptions::default();
    let listener = AsyncRdmaListener::new(
        RdmaListener::bind_with(&server_ctx, "127.0.0.1:0".parse().unwrap(), opts.clone()).unwrap(),
    );
    let at = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let mut buf = vec![0u8; 50_000];
        let mut total = 0;
        loop {
            let n = s.read(&mut buf).await.unwrap();
            if n == 0 {
                break;
            }
            s.write_all(&buf[..n]).await.unwrap();
            total += n;
        }
        s.shutdown().await.unwrap();
        total
    });
    let client_ctx = Device::with_config("sock-async", Config::default())
        .open()
        .unwrap();
    let client = AsyncRdmaStream::connect_with(&client_ctx, at, &opts)
        .await
        .unwrap();
    let (mut rd, mut wr) = tokio::io::split(client);
    let data: Vec<u8> = (0..1_500_000u32).map(|i| (i % 251) as u8).collect();
    let to_send = data.clone();
    let writer = tokio::spawn(async move {
        for chunk in to_send.chunks(33_333) {
            wr.write_all(chunk).await.unwrap();
        }
        wr.shutdown().await.unwrap();
        wr
    });
    let mut got = Vec::new();
    rd.read_to_end(&mut got).await.unwrap();
    assert!(
        got == data,
        "echoed bytes differ ({} of {})",
        got.len(),
        data.len()
    );
    assert_eq!(server.await.unwrap(), data.len());
    drop(writer.await.unwrap());
}

#[tokio::test]
async fn async_ping_pong_without_split() {
    let server_ctx = Device::with_config("sock-async", Config::default())
        .open()
        .unwrap();
    let opts = StreamOptions::default();
    let listener = AsyncRdmaListener::new(
        RdmaListener::bind_with(&server_ctx, "127.0.0.1:0".parse().unwrap(), opts.clone()).unwrap(),
    );
    let at = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let mut buf = [0u8; 10];
        s.read_exact(&mut buf).await.unwrap();
        s.write_all(&buf).await.unwrap();
        s
    });
    let client_ctx = Device::with_config("sock-async", Config::default())
        .open()
        .unwrap();
    let mut c = AsyncRdmaStream::connect_with(&client_ctx, at, &opts)
        .await
        .unwrap();
    c.write_all(b"0123456789").await.unwrap();
    let mut buf = [0u8; 10];
    c.read_exact(&mut buf).await.unwrap();
    let _s = server.await.unwrap();
}
