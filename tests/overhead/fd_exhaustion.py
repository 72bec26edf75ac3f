"""The gateway with its file descriptors exhausted: started under `prlimit --nofile=40` in front
of a running vllm-sim, 80 clients connect and stay; prints the gateway's CPU over 5 s, whether it
serves again once they leave, and its `accept failed` log lines.

usage: python3 tests/overhead/fd_exhaustion.py target/release/sparkgate 127.0.0.1:SIM_PORT
"""
import socket, subprocess, time, os, sys
gw_bin, sim_addr = sys.argv[1], sys.argv[2]
p = subprocess.Popen(["prlimit", "--nofile=40", gw_bin, "--profile", "deepseek-v4.1-flash", "serve", "--upstream", "http://"+sim_addr, "--port", "18941", "--bind", "127.0.0.1"],
                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=dict(os.environ, SPARKGATE_LOG="info", MAX_CONNECTIONS="100000"))
time.sleep(1.5)
socks = []
for _ in range(80):
    try:
        socks.append(socket.create_connection(("127.0.0.1", 18941), timeout=1))
    except Exception:
        pass
def cpu():
    f = open(f"/proc/{p.pid}/stat").read().split()
    return (int(f[13]) + int(f[14])) / os.sysconf("SC_CLK_TCK")
time.sleep(0.5)
c0, t0 = cpu(), time.time()
time.sleep(5)
c1, t1 = cpu(), time.time()
print(f"open client sockets: {len(socks)}; gateway CPU with descriptors exhausted: {100*(c1-c0)/(t1-t0):.1f} % of a core over {t1-t0:.1f} s")
for s in socks: s.close()
time.sleep(1.5)
try:
    s = socket.create_connection(("127.0.0.1", 18941), timeout=2); s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"); print("after the clients left:", s.recv(100).split(b"\r\n")[0])
except Exception as e:
    print("after:", e)
p.terminate(); out = p.communicate(timeout=10)[0].decode()
lines = [l for l in out.splitlines() if "accept failed" in l]
print(f"'accept failed' log lines: {len(lines)}"); print(lines[0][:300] if lines else "")
