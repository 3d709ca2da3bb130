//! A vCenter administrator beside the provider, speaking raw SOAP: to see what the
//! provider wrote (extraConfig), and to do what happens outside it (VMware Tools
//! reporting an IP, sessions being dropped). Answers are searched as text: the tests
//! know exactly what vcsim sends.

use provider_http::{CertFingerprint, HttpClient, HttpSettings, TlsConfig};

use super::Vcsim;

/// A logged-in raw SOAP session on vcsim.
pub struct Admin {
    http: HttpClient,
    url: String,
    cookie: String,
}

impl Admin {
    /// Logs in as an administrator (vcsim takes any user).
    pub async fn login(vcsim: &Vcsim) -> Admin {
        Admin::login_at(&vcsim.url, vcsim.fingerprint).await
    }

    /// Logs in to the vcsim at `url` whose certificate has this fingerprint.
    pub async fn login_at(url: &str, fingerprint: CertFingerprint) -> Admin {
        let http = HttpClient::new(
            &HttpSettings::new().with_tls(TlsConfig::new().with_pinned_sha256(fingerprint)),
        )
        .expect("http client");
        let mut admin = Admin {
            http,
            url: url.to_owned(),
            cookie: String::new(),
        };
        let answer = admin
            .post(
                "Login",
                "<_this type=\"SessionManager\">SessionManager</_this><userName>admin</userName><password>admin</password>",
                true,
            )
            .await;
        admin.cookie = answer.1.expect("Login set a session cookie");
        admin
    }

    async fn post(&self, method: &str, body: &str, login: bool) -> (String, Option<String>) {
        self.try_post(method, body, login)
            .await
            .unwrap_or_else(|e| panic!("vcsim does not answer {method}: {e}"))
    }

    async fn try_post(
        &self,
        method: &str,
        body: &str,
        login: bool,
    ) -> Result<(String, Option<String>), String> {
        let envelope = format!(
            "<?xml version=\"1.0\"?><soapenv:Envelope xmlns:soapenv=\"http://schemas.xmlsoap.org/soap/envelope/\" xmlns:xsi=\"http://www.w3.org/2001/XMLSchema-instance\" xmlns:xsd=\"http://www.w3.org/2001/XMLSchema\"><soapenv:Body><{method} xmlns=\"urn:vim25\">{body}</{method}></soapenv:Body></soapenv:Envelope>"
        );
        let mut req = self
            .http
            .inner()
            .post(&self.url)
            .header("SOAPAction", "\"urn:vim25/6.5\"")
            .header("Content-Type", "text/xml")
            .body(envelope);
        if !login {
            req = req.header("Cookie", &self.cookie);
        }
        let res = self.http.send(req).await.map_err(|e| e.to_string())?;
        let cookie = res
            .headers()
            .get("set-cookie")
            .and_then(|v| v.to_str().ok())
            .map(|v| v.split(';').next().unwrap_or("").to_owned());
        Ok((res.text().await.map_err(|e| e.to_string())?, cookie))
    }

    /// Calls `method`; the answer's text, or why not (a fault, a dropped connection).
    pub async fn try_call(&self, method: &str, body: &str) -> Result<String, String> {
        let (text, _) = self.try_post(method, body, false).await?;
        if text.contains("Fault>") {
            return Err(text);
        }
        Ok(text)
    }

    /// Calls `method`; the answer's text. Panics on a fault.
    pub async fn call(&self, method: &str, body: &str) -> String {
        let (text, _) = self.post(method, body, false).await;
        assert!(!text.contains("Fault>"), "{method} failed: {text}");
        text
    }

    /// The managed object id of the VM with this BIOS UUID.
    pub async fn vm_by_uuid(&self, uuid: &str) -> String {
        let text = self
            .call(
                "FindByUuid",
                &format!("<_this type=\"SearchIndex\">SearchIndex</_this><uuid>{uuid}</uuid><vmSearch>true</vmSearch>"),
            )
            .await;
        between(&text, "type=\"VirtualMachine\">", "<").expect("a VM with that UUID")
    }

    /// Sets one extraConfig key, as `govc vm.change -e` would.
    pub async fn set_extra(&self, vm: &str, key: &str, value: &str) {
        self.call(
            "ReconfigVM_Task",
            &format!(
                "<_this type=\"VirtualMachine\">{vm}</_this><spec><extraConfig xsi:type=\"OptionValue\"><key>{key}</key><value xsi:type=\"xsd:string\">{value}</value></extraConfig></spec>"
            ),
        )
        .await;
    }

    /// Clones the template `template` (a VM name in DC0's vm folder) as `name`,
    /// tagged for `owner` as the provider tags, with 2 CPUs and 128 MiB, powered off:
    /// what a create that stopped right after its clone leaves.
    pub async fn clone_tagged(&self, template: &str, name: &str, owner: &str) {
        let path = format!("DC0/vm/{template}");
        let find = |p: String| async move {
            self.call(
                "FindByInventoryPath",
                &format!("<_this type=\"SearchIndex\">SearchIndex</_this><inventoryPath>{p}</inventoryPath>"),
            )
            .await
        };
        let t = between(&find(path).await, "type=\"VirtualMachine\">", "<").expect("template");
        let f = between(&find("DC0/vm".into()).await, "type=\"Folder\">", "<").expect("folder");
        let pool = find("DC0/host/DC0_H0/Resources".into()).await;
        let pool = between(&pool, "type=\"ResourcePool\">", "<").expect("pool");
        let opt = |k: &str, v: &str| {
            format!(
                "<extraConfig xsi:type=\"OptionValue\"><key>{k}</key><value xsi:type=\"xsd:string\">{v}</value></extraConfig>"
            )
        };
        self.call(
            "CloneVM_Task",
            &format!(
                "<_this type=\"VirtualMachine\">{t}</_this><folder type=\"Folder\">{f}</folder><name>{name}</name><spec><location><pool type=\"ResourcePool\">{pool}</pool></location><template>false</template><config><numCPUs>2</numCPUs><memoryMB>128</memoryMB>{}{}</config><powerOn>false</powerOn></spec>",
                opt("machineprovisioning.owner", owner),
                opt("machineprovisioning.name", name),
            ),
        )
        .await;
    }

    /// Clones the template `template` (a VM name in DC0's vm folder) as a new template
    /// `name` there, as an administrator publishes one.
    pub async fn clone_template(&self, template: &str, name: &str) -> String {
        let find = |p: String| async move {
            self.call(
                "FindByInventoryPath",
                &format!("<_this type=\"SearchIndex\">SearchIndex</_this><inventoryPath>{p}</inventoryPath>"),
            )
            .await
        };
        let t = between(
            &find(format!("DC0/vm/{template}")).await,
            "type=\"VirtualMachine\">",
            "<",
        )
        .expect("template");
        let f = between(&find("DC0/vm".into()).await, "type=\"Folder\">", "<").expect("folder");
        let pool = find("DC0/host/DC0_H0/Resources".into()).await;
        let pool = between(&pool, "type=\"ResourcePool\">", "<").expect("pool");
        self.call(
            "CloneVM_Task",
            &format!(
                "<_this type=\"VirtualMachine\">{t}</_this><folder type=\"Folder\">{f}</folder><name>{name}</name><spec><location><pool type=\"ResourcePool\">{pool}</pool></location><template>false</template><powerOn>false</powerOn></spec>"
            ),
        )
        .await;
        let vm = between(
            &find(format!("DC0/vm/{name}")).await,
            "type=\"VirtualMachine\">",
            "<",
        )
        .expect("the clone");
        self.call(
            "MarkAsTemplate",
            &format!("<_this type=\"VirtualMachine\">{vm}</_this>"),
        )
        .await;
        vm
    }

    /// The managed object id of the VM named `name` in DC0's vm folder.
    pub async fn vm_by_name(&self, name: &str) -> String {
        let text = self
            .call(
                "FindByInventoryPath",
                &format!("<_this type=\"SearchIndex\">SearchIndex</_this><inventoryPath>DC0/vm/{name}</inventoryPath>"),
            )
            .await;
        between(&text, "type=\"VirtualMachine\">", "<").expect("a VM of that name")
    }

    /// Destroys the (powered-off) VM or template `vm`.
    pub async fn destroy(&self, vm: &str) {
        self.call(
            "Destroy_Task",
            &format!("<_this type=\"VirtualMachine\">{vm}</_this>"),
        )
        .await;
    }

    /// Sets the VM's virtual CPUs, as an administrator editing it would.
    pub async fn set_cpus(&self, vm: &str, cpus: u32) {
        self.call(
            "ReconfigVM_Task",
            &format!(
                "<_this type=\"VirtualMachine\">{vm}</_this><spec><numCPUs>{cpus}</numCPUs></spec>"
            ),
        )
        .await;
    }

    /// The VM's extraConfig as vcsim sends it (raw XML).
    pub async fn extra_config(&self, vm: &str) -> String {
        self.property(vm, "config.extraConfig").await
    }

    /// One property of the VM as vcsim sends it (raw XML).
    pub async fn property(&self, vm: &str, path: &str) -> String {
        self.call(
            "RetrievePropertiesEx",
            &format!(
                "<_this type=\"PropertyCollector\">propertyCollector</_this><specSet><propSet><type>VirtualMachine</type><pathSet>{path}</pathSet></propSet><objectSet><obj type=\"VirtualMachine\">{vm}</obj></objectSet></specSet><options/>"
            ),
        )
        .await
    }

    /// Whether the VM is powered on.
    pub async fn powered_on(&self, vm: &str) -> bool {
        self.property(vm, "runtime.powerState")
            .await
            .contains(">poweredOn<")
    }

    /// Property `path` of the object of type `kind` at inventory path `at`, as text.
    pub async fn property_of(&self, kind: &str, at: &str, path: &str) -> String {
        let found = self
            .call(
                "FindByInventoryPath",
                &format!("<_this type=\"SearchIndex\">SearchIndex</_this><inventoryPath>{at}</inventoryPath>"),
            )
            .await;
        let obj = between(&found, &format!("type=\"{kind}\">"), "<")
            .unwrap_or_else(|| panic!("no {kind} at {at}"));
        let text = self
            .call(
                "RetrievePropertiesEx",
                &format!(
                    "<_this type=\"PropertyCollector\">propertyCollector</_this><specSet><propSet><type>{kind}</type><pathSet>{path}</pathSet></propSet><objectSet><obj type=\"{kind}\">{obj}</obj></objectSet></specSet><options/>"
                ),
            )
            .await;
        let val = &text[text.find("<val").expect("a value")..];
        between(val, ">", "<").expect("a value")
    }

    /// How many VMs directly in the datacenter's vm folder are named `name`.
    pub async fn count_named(&self, name: &str) -> usize {
        let folder = self
            .call(
                "FindByInventoryPath",
                "<_this type=\"SearchIndex\">SearchIndex</_this><inventoryPath>DC0/vm</inventoryPath>",
            )
            .await;
        let folder = between(&folder, "type=\"Folder\">", "<").expect("DC0/vm");
        let text = self
            .call(
                "RetrievePropertiesEx",
                &format!(
                    "<_this type=\"PropertyCollector\">propertyCollector</_this><specSet><propSet><type>VirtualMachine</type><pathSet>name</pathSet></propSet><objectSet><obj type=\"Folder\">{folder}</obj><skip>true</skip><selectSet xsi:type=\"TraversalSpec\"><name>c</name><type>Folder</type><path>childEntity</path><skip>false</skip></selectSet></objectSet></specSet><options/>"
                ),
            )
            .await;
        text.matches(&format!(">{name}</val>")).count()
    }

    /// Ends every session but this one: what a vCenter restart or an administrator
    /// does to a provider's session.
    pub async fn terminate_other_sessions(&self) -> usize {
        let text = self
            .call(
                "RetrievePropertiesEx",
                "<_this type=\"PropertyCollector\">propertyCollector</_this><specSet><propSet><type>SessionManager</type><pathSet>sessionList</pathSet><pathSet>currentSession</pathSet></propSet><objectSet><obj type=\"SessionManager\">SessionManager</obj></objectSet></specSet><options/>",
            )
            .await;
        let mine = between(
            &text[text.find("currentSession").expect("currentSession")..],
            "<key>",
            "<",
        )
        .expect("own key");
        let keys: Vec<String> = text
            .split("<key>")
            .skip(1)
            .filter_map(|s| s.split('<').next().map(str::to_owned))
            .filter(|k| *k != mine)
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        let ids: String = keys
            .iter()
            .map(|k| format!("<sessionId>{k}</sessionId>"))
            .collect();
        if !keys.is_empty() {
            self.call(
                "TerminateSession",
                &format!("<_this type=\"SessionManager\">SessionManager</_this>{ids}"),
            )
            .await;
        }
        keys.len()
    }
}

/// The text between the first `start` and the next `end`.
fn between(text: &str, start: &str, end: &str) -> Option<String> {
    let from = text.find(start)? + start.len();
    let rest = &text[from..];
    Some(rest[..rest.find(end)?].to_owned())
}
