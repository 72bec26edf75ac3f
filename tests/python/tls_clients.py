"""HTTPS through real clients (tests/tests/service_tls.rs): the openai and anthropic SDKs
verify the gateway's certificate against the test's CA (their httpx clients' `verify=`), 20 streams are held
open while the certificate is rotated (new files, SIGHUP), every stream must finish, and a new
connection must be served the new certificate. Prints one JSON line."""
import json
import os
import signal
import socket
import ssl
import sys
import threading
import time

import anthropic
import openai

base = os.environ["SPARKGATE_BASE_URL"]
model = os.environ["SPARKGATE_MODEL"]
ca = os.environ["SPARKGATE_CA"]
pid = int(os.environ["SPARKGATE_PID"])
cert, key = os.environ["SPARKGATE_CERT"], os.environ["SPARKGATE_KEY"]
new_cert, new_key = os.environ["SPARKGATE_NEW_CERT"], os.environ["SPARKGATE_NEW_KEY"]
out = {}

oa = openai.OpenAI(base_url=base + "/v1", api_key="none", http_client=openai.DefaultHttpxClient(verify=ca))
r = oa.chat.completions.create(
    model=model,
    messages=[{"role": "user", "content": "What is 17*19? Reply with the integer only."}],
    max_tokens=16,
    extra_body={"chat_template_kwargs": {"enable_thinking": False}},
)
out["openai"] = r.choices[0].message.content

an = anthropic.Anthropic(base_url=base, api_key="none", http_client=anthropic.DefaultHttpxClient(verify=ca))
m = an.messages.create(model=model, max_tokens=16, messages=[{"role": "user", "content": "Say hi."}])
out["anthropic"] = m.stop_reason

# A client that does not trust the CA is refused in the handshake.
try:
    openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0).models.list()
    out["untrusted"] = "accepted"
except openai.APIConnectionError as e:
    out["untrusted"] = "refused: " + repr(e.__cause__)[:120]

def served_serial():
    ctx = ssl.create_default_context(cafile=ca)
    host, port = base.removeprefix("https://").split(":")
    with socket.create_connection((host, int(port))) as raw:
        with ctx.wrap_socket(raw, server_hostname="localhost") as s:
            der = s.getpeercert(binary_form=True)
    return der.hex()

out["before"] = served_serial()

streams = 20
opened = threading.Barrier(streams + 1)
finished = [None] * streams

def stream(i):
    client = openai.OpenAI(base_url=base + "/v1", api_key="none", http_client=openai.DefaultHttpxClient(verify=ca))
    s = client.chat.completions.create(
        model=model, stream=True, max_tokens=48,
        messages=[{"role": "user", "content": f"Count to forty, stream {i}."}],
        extra_body={"ignore_eos": True},
    )
    first = True
    reason = None
    chunks = 0
    for chunk in s:
        if first:
            first = False
            opened.wait()
        chunks += 1
        if chunk.choices and chunk.choices[0].finish_reason:
            reason = chunk.choices[0].finish_reason
    finished[i] = (reason, chunks)

threads = [threading.Thread(target=stream, args=(i,)) for i in range(streams)]
for t in threads:
    t.start()
opened.wait(timeout=60)
# Rotated under the open streams: new files in place (renamed in, as a deploy tool does), then SIGHUP.
for src, dst in ((new_cert, cert), (new_key, key)):
    tmp = dst + ".new"
    with open(src, "rb") as f, open(tmp, "wb") as g:
        g.write(f.read())
    os.replace(tmp, dst)
os.kill(pid, signal.SIGHUP)
for t in threads:
    t.join(timeout=120)
out["streams"] = finished
deadline = time.time() + 10
while time.time() < deadline:
    out["after"] = served_serial()
    if out["after"] != out["before"]:
        break
    time.sleep(0.1)
with open(new_cert) as f:
    out["new_is_served"] = out["after"] == ssl.PEM_cert_to_DER_cert(f.read().split("-----END CERTIFICATE-----")[0] + "-----END CERTIFICATE-----\n").hex()
print(json.dumps(out))
