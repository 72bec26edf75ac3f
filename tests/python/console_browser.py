"""The console in a real browser: headless Chromium (Debian's) driven by selenium through
Debian's chromedriver, against a running gateway (tests/tests/console.rs starts the demo).

Env: SPARKGATE_BASE_URL, SPARKGATE_MODEL, SPARKGATE_ADMIN_TOKEN, SPARKGATE_MEMBER_KEY (bob's),
SPARKGATE_USAGE_KEY (alice's, sent 100 requests from here), SPARKGATE_SHOTS (a directory for
the screenshots). Prints one JSON line of what it saw; the Rust test asserts on it.
"""

import json
import os
import threading
import time
import urllib.error
import urllib.request

import openai
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select, WebDriverWait

BASE = os.environ["SPARKGATE_BASE_URL"]
MODEL = os.environ["SPARKGATE_MODEL"]
ADMIN = os.environ["SPARKGATE_ADMIN_TOKEN"]
MEMBER = os.environ["SPARKGATE_MEMBER_KEY"]
USAGE_KEY = os.environ["SPARKGATE_USAGE_KEY"]
SHOTS = os.environ["SPARKGATE_SHOTS"]
out = {}


def browser():
    o = webdriver.ChromeOptions()
    o.binary_location = "/usr/bin/chromium"
    for a in ["--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,900"]:
        o.add_argument(a)
    return webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=o)


def text(d, id_):
    return d.find_element(By.ID, id_).text


def rows(d, table):
    """A table's body as lists of cell texts, read in one script: the page re-renders its tables
    as it polls, so elements found one call may be gone the next."""
    return d.execute_script(
        "return [...document.querySelectorAll('#' + arguments[0] + ' tbody tr')]"
        ".map(tr => [...tr.cells].map(td => td.textContent))", table)


def chart(d):
    """The usage chart's totals (its <svg>'s data attributes), or None before it is drawn."""
    return d.execute_script(
        "const s = document.querySelector('#chart svg');"
        "return s ? {prompt: +s.dataset.prompt, completion: +s.dataset.completion, requests: +s.dataset.requests} : null")


def shot(d, name):
    d.save_screenshot(os.path.join(SHOTS, f"{name}.png"))


def get(path, cookie=None, token=None):
    """GET on the gateway with a cookie or a token: (status, body)."""
    req = urllib.request.Request(BASE + path)
    if cookie:
        req.add_header("Cookie", f"sparkgate_console={cookie}")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def sign_in(d, token, wait):
    d.get(BASE + "/console")
    wait.until(lambda d: d.find_element(By.ID, "signin").is_displayed())
    d.find_element(By.ID, "token").send_keys(token)
    d.find_element(By.ID, "signin-button").click()


def tab(d, view):
    d.find_element(By.CSS_SELECTOR, f'#tabs button[data-view="{view}"]').click()


def confirm(d, wait):
    wait.until(lambda d: d.find_element(By.ID, "confirm").get_attribute("open") is not None)
    d.find_element(By.ID, "confirm-ok").click()


def act(d, wait, button):
    d.find_element(By.ID, button).click()
    confirm(d, wait)
    wait.until(lambda d: text(d, "outcome") != "")
    return [li.text for li in d.find_elements(By.CSS_SELECTOR, "#phases li")], text(d, "outcome")


def stream_through_restart(client, result):
    """A client stream that runs while the operator restarts the group."""
    try:
        parts, finish = [], None
        stream = client.chat.completions.create(
            model=MODEL, stream=True, max_tokens=120,
            messages=[{"role": "user", "content": "Count from one onwards, slowly."}])
        for chunk in stream:
            if chunk.choices:
                parts.append(chunk.choices[0].delta.content or "")
                finish = chunk.choices[0].finish_reason or finish
        result.update(finish=finish, chars=len("".join(parts)))
    except Exception as e:  # noqa: BLE001 - the test reports whatever broke
        result.update(error=repr(e))


def operator(d):
    # Generous: the suite runs beside other tests on two cores.
    wait = WebDriverWait(d, 120)
    # A wrong token first: the page says so.
    sign_in(d, "not-the-token", wait)
    wait.until(lambda d: text(d, "signin-error") != "")
    out["wrong_token_message"] = text(d, "signin-error")
    shot(d, "signin")
    sign_in(d, ADMIN, wait)
    wait.until(lambda d: text(d, "state") == "ready" and len(rows(d, "ranks")) == 2)
    out["overview"] = {"state": text(d, "state"), "ranks": [" ".join(r) for r in rows(d, "ranks")],
                       "who": text(d, "who")}
    shot(d, "overview")
    cookie = d.get_cookie("sparkgate_console")
    out["cookie"] = {"httpOnly": cookie["httpOnly"], "sameSite": cookie.get("sameSite")}
    # Restart with a client's stream running.
    client = openai.OpenAI(base_url=BASE + "/v1", api_key=MEMBER, max_retries=0)
    streamed = {}
    t = threading.Thread(target=stream_through_restart, args=(client, streamed))
    t.start()
    wait.until(lambda d: get("/admin/requests", cookie=cookie["value"])[1]["in_flight"])
    tab(d, "actions")
    phases, outcome = act(d, wait, "act-restart")
    t.join(120)
    out["restart"] = {"phases": phases, "outcome": outcome, "stream": streamed}
    shot(d, "actions")
    # The speculation mode, switched from the page.
    wait.until(lambda d: len(Select(d.find_element(By.ID, "spec-mode")).options) > 1)
    select = Select(d.find_element(By.ID, "spec-mode"))
    before = select.first_selected_option.get_attribute("value")
    other = next(o.get_attribute("value") for o in select.options if o.get_attribute("value") != before)
    select.select_by_value(other)
    phases, outcome = act(d, wait, "act-spec")
    out["spec"] = {"from": before, "to": other, "phases": phases, "outcome": outcome,
                   "now": get("/admin/spec", token=ADMIN)[1]["mode"]}
    # 100 requests from one key, then its chart.
    alice = openai.OpenAI(base_url=BASE + "/v1", api_key=USAGE_KEY, max_retries=0)
    for i in range(100):
        alice.chat.completions.create(model=MODEL, max_tokens=4, messages=[{"role": "user", "content": f"Say {i}."}])
    tab(d, "usage")
    wait.until(lambda d: d.execute_script("return document.getElementById('usage-key').options.length") > 1)
    # The key list is rebuilt at each refresh: chosen in one script, then its change announced.
    d.execute_script("const s = document.getElementById('usage-key'); s.value = 'alice';"
                     "s.dispatchEvent(new Event('change'))")
    wait.until(lambda d: (chart(d) or {}).get("requests") == 100)
    out["chart"] = chart(d)
    out["csv_is_data"] = d.find_element(By.ID, "csv").get_attribute("href").startswith("data:text/csv")
    shot(d, "usage")
    tab(d, "events")
    wait.until(lambda d: rows(d, "events"))
    out["events"] = [r[2] for r in rows(d, "events")]
    # An unplanned restart: rank 0 killed; its warning links the diagnostics bundle.
    status = get("/console/api/status", cookie=cookie["value"])[1]
    rank0 = next(r for r in status["supervisor"]["ranks"] if r["rank"] == 0)
    os.kill(rank0["pid"], 9)
    Select(d.find_element(By.ID, "level")).select_by_value("warn")
    link_of = "const a = document.querySelector('#events tbody tr a'); return a ? a.href : null"
    wait.until(lambda d: d.execute_script(link_of))
    link = d.execute_script(link_of)
    seen = rows(d, "events")
    req = urllib.request.Request(link, headers={"Cookie": f"sparkgate_console={cookie['value']}"})
    with urllib.request.urlopen(req, timeout=30) as r:
        bundle = r.read().decode()
    out["unplanned"] = {"levels": sorted({r[1] for r in seen}),
                        "first": seen[0][2],
                        "bundle_files": bundle.count("==> ")}
    shot(d, "events")
    wait.until(lambda d: get("/console/api/status", cookie=cookie["value"])[1]["ready"])
    tab(d, "requests")
    shot(d, "requests")
    tab(d, "settings")
    wait.until(lambda d: rows(d, "settings"))
    out["settings_rows"] = len(rows(d, "settings"))
    out["admin_token_in_page"] = ADMIN in d.page_source
    shot(d, "settings")
    # Sign out: the cookie the browser held no longer opens anything.
    d.find_element(By.ID, "signout").click()
    wait.until(lambda d: d.find_element(By.ID, "signin").is_displayed())
    out["after_sign_out"] = {"admin": get("/admin/status", cookie=cookie["value"])[0],
                             "console": get("/console/api/status", cookie=cookie["value"])[0]}


def member(d):
    wait = WebDriverWait(d, 120)
    sign_in(d, MEMBER, wait)
    wait.until(lambda d: text(d, "state") == "ready" and len(rows(d, "ranks")) == 2)
    visible = [b.get_attribute("data-view") for b in d.find_elements(By.CSS_SELECTOR, "#tabs button") if b.is_displayed()]
    tab(d, "usage")
    wait.until(lambda d: rows(d, "usage"))
    keys = [r[0] for r in rows(d, "usage")]
    shot(d, "member-usage")
    cookie = d.get_cookie("sparkgate_console")["value"]
    out["member"] = {"who": text(d, "who"), "tabs": visible, "usage_keys": keys,
                     "action_buttons": len([b for b in d.find_elements(By.CSS_SELECTOR, "[data-action]") if b.is_displayed()]),
                     "admin_status": get("/admin/status", cookie=cookie)[0],
                     "own_usage_only": get("/console/api/usage?window=hour&key=alice", cookie=cookie)[1]["key"]}


d = browser()
try:
    operator(d)
    d.delete_all_cookies()
    member(d)
except Exception:
    # What was seen so far, and the page the step failed on, for the test's message.
    import sys
    import traceback
    traceback.print_exc()
    print(json.dumps(out), file=sys.stderr)
    shot(d, "failed")
    print(d.find_element(By.TAG_NAME, "body").text, file=sys.stderr)
    raise
finally:
    d.quit()
print(json.dumps(out))
