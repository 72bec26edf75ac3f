"""The gateway's CPU at idle with one console page open, against none (BENCHMARKS.md, "The
console"): the process's user+system ticks from /proc/PID/stat over SECONDS, first with no page,
then with the overview open (it polls every 1.5 s), then with the actions view (0.4 s).

usage: python3 tests/console/idle_cpu.py BASE_URL GATEWAY_PID ADMIN_TOKEN SECONDS
"""
import os, sys, time
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait
base, pid, token, secs = sys.argv[1], int(sys.argv[2]), sys.argv[3], float(sys.argv[4])
tck = os.sysconf("SC_CLK_TCK")
def cpu():
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / tck
def measure(label):
    a, t = cpu(), time.time(); time.sleep(secs); b, u = cpu(), time.time()
    print(f"{label}: {100 * (b - a) / (u - t):.3f} % of a core over {u - t:.0f} s")
measure("no page open")
o = webdriver.ChromeOptions(); o.binary_location = "/usr/bin/chromium"
for a in ["--headless=new", "--no-sandbox", "--disable-dev-shm-usage"]: o.add_argument(a)
d = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=o)
d.get(base + "/console")
WebDriverWait(d, 10).until(lambda d: d.find_element(By.ID, "signin").is_displayed())
d.find_element(By.ID, "token").send_keys(token); d.find_element(By.ID, "signin-button").click()
WebDriverWait(d, 10).until(lambda d: d.find_element(By.ID, "state").text == "ready")
measure("overview open (polls every 1.5 s)")
d.find_element(By.CSS_SELECTOR, '#tabs button[data-view="actions"]').click()
measure("actions open (polls every 0.4 s while idle: spec once)")
d.quit()
