//! Fig. 11's server-side span through the real manager: `io.redn.Admin.TriggerTimes` gives
//! when each trigger reached the manager's softnic, a remote client's response carries when
//! it reached the client's; both are CQE timestamps on the host's monotonic clock.

mod common;

use common::*;
use redn_client::remote::{RemoteClient, RemoteOptions};
use redn_proto::api;

#[test]
fn each_trigger_arrives_at_the_server_between_its_send_and_its_response() {
    let m = Manager::start_with_dataplane(&policy("", ""));
    let mut app = m.client();
    let echo = app.install("echo", &[]).unwrap();
    let endpoint = echo.endpoint.clone().expect("an endpoint");
    let options = RemoteOptions {
        timeout: DEADLINE,
        ..Default::default()
    };
    let mut c = RemoteClient::connect(endpoint.parse().unwrap(), echo.handle, &echo.token, options)
        .unwrap();
    let payload: Vec<u8> = (0..64).collect();
    // Sent one at a time: trigger i reaches the server after it was sent and before its
    // response reaches the client.
    let mut windows = Vec::new();
    for _ in 0..5 {
        let sent = redn_sys::softnic::completion_clock_ns();
        let r = c.trigger(&payload, 1).unwrap();
        assert_eq!(r[0].data, payload);
        windows.push((sent, r[0].received_ns));
    }
    let times: api::TriggerTimesReply = m.admin_call(
        "io.redn.Admin.TriggerTimes",
        serde_json::json!({ "handle": echo.handle }),
    );
    assert_eq!(times.dropped, 0);
    assert_eq!(times.received_ns.len(), 5, "{times:?}");
    for ((sent, answered), arrived) in windows.iter().zip(&times.received_ns) {
        assert!(
            sent < arrived && arrived < answered,
            "sent {sent}, arrived {arrived}, answered {answered}"
        );
    }
    // Taken: asked again, nothing new.
    let again: api::TriggerTimesReply = m.admin_call(
        "io.redn.Admin.TriggerTimes",
        serde_json::json!({ "handle": echo.handle }),
    );
    assert!(again.received_ns.is_empty());
}
