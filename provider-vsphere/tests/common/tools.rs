//! A VMware Tools stand-in: vcsim runs no guest, so nothing reports a powered-on VM's
//! IP address as VMware Tools in a booted guest would. This watches vcsim (its own
//! session, over the wire) and gives every powered-on VM without one an address,
//! through extraConfig `SET.guest.ipAddress` (vcsim's way to set `guest.ipAddress`
//! and `guest.net`), as the bench's stand-in does.

use std::time::Duration;

use super::Vcsim;
use super::admin::Admin;

/// How often the stand-in looks: a guest reports its address this long after power-on
/// at most (plus vcsim's answer).
const POLL: Duration = Duration::from_millis(25);

/// The stand-in, stopped when dropped.
pub struct Tools {
    task: tokio::task::JoinHandle<()>,
}

impl Tools {
    /// Starts watching `vcsim`, on the current tokio runtime.
    pub async fn start(vcsim: &Vcsim) -> Tools {
        Tools::watch(Admin::login(vcsim).await).await
    }

    /// Starts watching the vcsim `admin` is logged in to.
    pub async fn watch(admin: Admin) -> Tools {
        let view = admin
            .call(
                "CreateContainerView",
                "<_this type=\"ViewManager\">ViewManager</_this><container type=\"Folder\">group-d1</container><type>VirtualMachine</type><recursive>true</recursive>",
            )
            .await;
        let view = after(&view, "type=\"ContainerView\">").expect("a container view");
        let task = tokio::spawn(async move {
            let mut given: u32 = 0;
            loop {
                for vm in booted_without_ip(&admin, &view).await {
                    given += 1;
                    let ip = format!(
                        "10.{}.{}.{}",
                        100 + (given >> 16) % 100,
                        (given >> 8) & 255,
                        given & 255
                    );
                    // Destroyed or stopped meanwhile: nothing to report.
                    let _ = admin
                        .try_call(
                            "ReconfigVM_Task",
                            &format!(
                                "<_this type=\"VirtualMachine\">{vm}</_this><spec><extraConfig xsi:type=\"OptionValue\"><key>SET.guest.ipAddress</key><value xsi:type=\"xsd:string\">{ip}</value></extraConfig></spec>"
                            ),
                        )
                        .await;
                }
                tokio::time::sleep(POLL).await;
            }
        });
        Tools { task }
    }
}

impl Drop for Tools {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The powered-on VMs (not templates) that have no guest IP yet.
async fn booted_without_ip(admin: &Admin, view: &str) -> Vec<String> {
    let Ok(text) = admin
        .try_call(
            "RetrievePropertiesEx",
            &format!(
                "<_this type=\"PropertyCollector\">propertyCollector</_this><specSet><propSet><type>VirtualMachine</type><pathSet>runtime.powerState</pathSet><pathSet>guest.ipAddress</pathSet></propSet><objectSet><obj type=\"ContainerView\">{view}</obj><skip>true</skip><selectSet xsi:type=\"TraversalSpec\"><name>v</name><type>ContainerView</type><path>view</path><skip>false</skip></selectSet></objectSet></specSet><options/>"
            ),
        )
        .await
    else {
        return Vec::new();
    };
    text.split("<objects>")
        .skip(1)
        .filter(|o| o.contains(">poweredOn<") && !o.contains("<name>guest.ipAddress</name>"))
        .filter_map(|o| after(o, "type=\"VirtualMachine\">"))
        .collect()
}

/// The text after `start`, up to the next `<`.
fn after(text: &str, start: &str) -> Option<String> {
    let from = text.find(start)? + start.len();
    let rest = &text[from..];
    Some(rest[..rest.find('<')?].to_owned())
}
