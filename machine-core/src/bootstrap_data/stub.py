# machine-core: user data by reference (machine_core::bootstrap_data). cloud-init
# imports this part handler while it walks the user data; at the end of the walk, after
# its own handlers have finished with the stub, the handler fetches the machine's real
# user data from where POINTER says, refuses it unless its SHA-256 is the one below, and
# hands it to cloud-init's own part handlers in this same stage, exactly as if it had
# been the user data: cloud-config parts merge into cloud-config.txt, scripts land in the
# scripts directory, boothooks run. A failure writes a failing script named after the
# reason, so cloud-init's verdict (and every completion check) names it, and nothing of
# the real user data is applied.
import base64, hashlib, hmac, json, os, ssl, sys, time
import http.client, urllib.parse
from datetime import datetime, timezone

POINTER = @POINTER@
KEPT = "user-data-by-reference.txt"
FAILED = "machine-core-by-reference-failed-"
handler_version = 2
frequency = "always"


def list_types():
    return ["text/x-machine-core-by-reference"]


class Failed(Exception):
    def __init__(self, slug, message):
        Exception.__init__(self, message)
        self.slug = slug


def handle_part(data, ctype, filename, payload, freq):
    if ctype != "__end__":
        return
    try:
        consume(data, freq)
    except Failed as e:
        fail(data, e.slug, str(e))
    except Exception as e:
        fail(data, "error", "%s: %s" % (type(e).__name__, e))


def consume(cloud, freq):
    want = POINTER["sha256"]
    kept = os.path.join(cloud.paths.get_ipath_cur(), KEPT)
    doc = None
    try:
        with open(kept, "rb") as f:
            doc = f.read()
        if hashlib.sha256(doc).hexdigest() != want:
            doc = None
    except OSError:
        pass
    if doc is None:
        doc = fetch(POINTER["location"])
        got = hashlib.sha256(doc).hexdigest()
        if got != want:
            raise Failed("digest-mismatch", "the fetched user data has SHA-256 %s, the stub expects %s: refused" % (got, want))
        # Kept root-only beside user-data.txt, as inline user data is, so that later
        # boots of this instance consume it again without fetching.
        tmp = kept + ".tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(doc)
        os.replace(tmp, kept)
    try:
        from cloudinit import stages, user_data
        init = stages.Init()
        init.read_cfg()
        init.datasource = cloud.datasource
        msg = user_data.UserDataProcessor(init.paths).process(doc)
        handlers = init._default_handlers()
        walk = init._do_handlers
    except (ImportError, AttributeError, TypeError) as e:
        raise Failed("unsupported-cloud-init", "this cloud-init cannot consume user data by reference: %s" % e)
    # A part handler in the real user data is imported under the name this one has.
    sys.modules.pop(__name__, None)
    walk(msg, handlers, freq)


def fail(cloud, slug, message):
    message = "user data by reference: " + message
    sys.stderr.write(message + "\n")
    try:
        import logging
        logging.getLogger("cloudinit.machine-core").error(message)
    except Exception:
        pass
    scripts = cloud.paths.get_ipath_cur("scripts")
    os.makedirs(scripts, exist_ok=True)
    path = os.path.join(scripts, FAILED + slug)
    quoted = "'" + message.replace("'", "'\\''") + "'"
    with open(path, "w") as f:
        f.write("#!/bin/sh\necho %s >&2\nexit 1\n" % quoted)
    os.chmod(path, 0o700)


def fetch(loc):
    if loc["kind"] == "https":
        return fetch_https(loc)
    if loc["kind"] == "aws-secretsmanager":
        return fetch_secrets(loc)
    raise Failed("unknown-location", "unknown location kind %r" % loc["kind"])


def retrying(what, attempt):
    # Transient failures (no route yet, a reset, 429, 5xx) are tried again until the
    # window closes; refusals are final.
    deadline = time.monotonic() + POINTER["fetch_for_s"]
    pause, last = 1.0, None
    while True:
        try:
            return attempt()
        except Failed:
            raise
        except Exception as e:
            last = e
        if time.monotonic() + pause > deadline:
            raise Failed("fetch-failed", "cannot fetch %s: %s" % (what, last))
        time.sleep(pause)
        pause = min(pause * 2, 15.0)


class Transient(Exception):
    pass


def fetch_https(loc):
    url = urllib.parse.urlsplit(loc["url"])
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    # The pin: only the one certificate is trusted, whatever name or address reaches it.
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.load_verify_locations(cadata=loc["certificate"])
    where = "%s:%s" % (url.hostname, url.port or 443)

    def attempt():
        conn = http.client.HTTPSConnection(url.hostname, url.port or 443, timeout=30, context=ctx)
        try:
            conn.connect()
            der = conn.sock.getpeercert(binary_form=True)
            if hashlib.sha256(der).hexdigest() != loc["certificate_sha256"]:
                raise Failed("certificate-mismatch", "%s showed another certificate than the pinned one" % where)
            conn.putrequest("GET", url.path, skip_accept_encoding=True)
            conn.putheader("User-Agent", "machine-core-by-reference")
            conn.endheaders()
            r = conn.getresponse()
            body = r.read(POINTER["max_bytes"] + 1)
            if r.status == 200:
                if len(body) > POINTER["max_bytes"]:
                    raise Failed("too-large", "%s served more than %d bytes" % (where, POINTER["max_bytes"]))
                return body
            if r.status in (429,) or r.status >= 500:
                raise Transient("HTTP %d" % r.status)
            why = {410: "already fetched or withdrawn", 404: "unknown token", 403: "this client is not allowed"}
            raise Failed("refused-%d" % r.status, "%s refused the fetch: HTTP %d (%s)" % (where, r.status, why.get(r.status, "refused")))
        finally:
            conn.close()

    return retrying(where, attempt)


def fetch_secrets(loc):
    region = loc["region"]
    endpoint = loc.get("endpoint") or "https://secretsmanager.%s.amazonaws.com" % region
    creds = retrying("instance credentials", lambda: instance_credentials(loc.get("metadata") or "http://169.254.169.254"))
    out = []
    for sid in loc["secret_ids"]:
        body = json.dumps({"SecretId": sid}).encode()
        reply = retrying("secret %s" % sid, lambda: aws_call(endpoint, region, "secretsmanager", "secretsmanager.GetSecretValue", body, creds))
        if "SecretBinary" in reply:
            out.append(base64.b64decode(reply["SecretBinary"]))
        else:
            out.append(reply.get("SecretString", "").encode("utf-8"))
    return b"".join(out)


def http_call(base, method, path, headers, body=None):
    u = urllib.parse.urlsplit(base)
    cls = http.client.HTTPSConnection if u.scheme == "https" else http.client.HTTPConnection
    conn = cls(u.hostname, u.port, timeout=10)
    try:
        conn.request(method, (u.path.rstrip("/") or "") + path, body=body, headers=headers)
        r = conn.getresponse()
        return r.status, r.read(1 << 20)
    finally:
        conn.close()


def instance_credentials(base):
    # IMDSv2 first; IMDSv1 where the token call is refused.
    headers = {}
    status, token = http_call(base, "PUT", "/latest/api/token", {"X-aws-ec2-metadata-token-ttl-seconds": "300"})
    if status == 200:
        headers["X-aws-ec2-metadata-token"] = token.decode()
    status, roles = http_call(base, "GET", "/latest/meta-data/iam/security-credentials/", headers)
    if status != 200 or not roles.strip():
        raise Transient("no instance role credentials (HTTP %d)" % status)
    role = roles.decode().split()[0]
    status, creds = http_call(base, "GET", "/latest/meta-data/iam/security-credentials/" + role, headers)
    if status != 200:
        raise Transient("no credentials for role %s (HTTP %d)" % (role, status))
    return json.loads(creds.decode())


def aws_call(endpoint, region, service, target, body, creds):
    u = urllib.parse.urlsplit(endpoint)
    host = u.netloc
    now = datetime.now(timezone.utc)
    amz_date = now.strftime("%Y%m%dT%H%M%SZ")
    day = now.strftime("%Y%m%d")
    headers = {
        "content-type": "application/x-amz-json-1.1",
        "host": host,
        "x-amz-date": amz_date,
        "x-amz-target": target,
    }
    if creds.get("Token"):
        headers["x-amz-security-token"] = creds["Token"]
    names = sorted(headers)
    canonical = "\n".join([
        "POST", "/", "",
        "".join("%s:%s\n" % (n, headers[n]) for n in names),
        ";".join(names),
        hashlib.sha256(body).hexdigest(),
    ])
    scope = "%s/%s/%s/aws4_request" % (day, region, service)
    to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest()])
    key = ("AWS4" + creds["SecretAccessKey"]).encode()
    for part in (day, region, service, "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    headers["authorization"] = "AWS4-HMAC-SHA256 Credential=%s/%s, SignedHeaders=%s, Signature=%s" % (
        creds["AccessKeyId"], scope, ";".join(names), signature)
    del headers["host"]
    status, reply = http_call(endpoint, "POST", "/", headers, body)
    if status == 200:
        return json.loads(reply.decode())
    if status == 429 or status >= 500:
        raise Transient("HTTP %d" % status)
    try:
        kind = json.loads(reply.decode()).get("__type", "")
    except Exception:
        kind = ""
    kind = kind.rsplit("#", 1)[-1]
    if "Throttl" in kind:
        raise Transient(kind)
    slug = {"ResourceNotFoundException": "refused-not-found", "AccessDeniedException": "refused-access-denied"}.get(kind, "refused-%d" % status)
    raise Failed(slug, "Secrets Manager refused %s: HTTP %d %s" % (target.split(".")[-1], status, kind))
