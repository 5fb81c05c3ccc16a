//! Feeds arbitrary bytes to the same-host handshake parser: no panic, and whatever
//! parses re-emits to a datagram that parses back to the same handshake.
#![no_main]

use libfuzzer_sys::fuzz_target;
use softverbs_wire::samehost::{is_hello, Hello};

fuzz_target!(|data: &[u8]| {
    let looks = is_hello(data);
    if let Ok(h) = Hello::parse(data) {
        assert!(looks);
        let again = Hello::parse(&h.emit()).expect("an emitted handshake parses");
        assert_eq!(again, h, "parse -> emit -> parse");
    }
});
