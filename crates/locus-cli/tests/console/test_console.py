"""The web console in a real browser (Debian's chromium, driven by Playwright).

Starts `locus serve --http-port 0` with two subjects, makes a known workload with the
CLI, and checks each view as a user sees it: logging in (a wrong token is refused), the
tree (listing, preview, download, upload), the load plots, and the code view (a storelet
started from the CLI is listed and cancelled from the page; a non-admin sees only their
own runs). Screenshots of each view go to $SCREENSHOTS (docs/console/ in the repository).
"""

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from playwright.sync_api import expect, sync_playwright

LOCUS = os.environ["LOCUS_BIN"]
SHOTS = Path(os.environ["SCREENSHOTS"])
ADMIN, BOB = "admin:" + "a" * 64, "bob:" + "b" * 64


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("console")
    (tmp / "state").mkdir()
    (tmp / "state" / "tokens").write_text(f"{ADMIN.replace(':', ' ')}\n{BOB.replace(':', ' ')}\n")
    env = dict(os.environ, HOME=str(tmp), RUST_BACKTRACE="0")
    proc = subprocess.Popen(
        [LOCUS, "serve", "--root", str(tmp / "export"), "--state", str(tmp / "state"),
         "--listen", "127.0.0.1:0", "--port-file", str(tmp / "ports"), "--http-port", "0",
         "--load-sample-ms", "250"],
        env=env, stderr=subprocess.DEVNULL)
    ports = {}
    deadline = time.time() + 20
    while "http" not in ports:
        assert time.time() < deadline and proc.poll() is None, "the server did not start"
        time.sleep(0.05)
        if (tmp / "ports").exists():
            lines = (tmp / "ports").read_text().split()
            ports = {"native": lines[0], **dict(zip(lines[1::2], lines[2::2]))} if lines else {}
    s = {
        "tmp": tmp,
        "export": tmp / "export",
        "url": f"locus://127.0.0.1:{ports['native']}",
        "console": f"http://127.0.0.1:{ports['http']}/",
        "env": dict(env, LOCUS_HOME=str(tmp / "home")),
    }
    locus(s, ADMIN, "acl", "set", s["url"] + "/", "bob", "rlx")
    yield s
    proc.terminate()
    proc.wait(10)


def locus(s, token, *args, check=True):
    out = subprocess.run([LOCUS, *args], env=dict(s["env"], LOCUS_TOKEN=token), capture_output=True, text=True)
    if check:
        assert out.returncode == 0, out.stderr
    return out


@pytest.fixture(scope="module")
def browser():
    with sync_playwright() as p:
        exe = shutil.which("chromium") or shutil.which("chromium-browser")
        b = p.chromium.launch(executable_path=exe, args=["--no-sandbox"])
        yield b
        b.close()


def log_in(page, s, token):
    page.goto(s["console"])
    page.fill("#token", token)
    page.click("#login-form button")
    expect(page.locator("#who")).to_contain_text(token.split(":")[0])


def test_a_wrong_token_is_refused(server, browser):
    page = browser.new_page(viewport={"width": 1200, "height": 800})
    page.goto(server["console"])
    expect(page.locator("#view-login")).to_be_visible()
    page.fill("#token", "admin:" + "0" * 64)
    page.click("#login-form button")
    expect(page.locator("#login-error")).to_contain_text("Refused")
    expect(page.locator("#nav")).to_be_hidden()
    page.screenshot(path=SHOTS / "login.png")
    page.close()


def test_the_tree_lists_previews_downloads_and_uploads(server, browser, tmp_path):
    data = "".join(f"{i},{i * i}\n" for i in range(2000))
    src = tmp_path / "squares.csv"
    src.write_text(data)
    locus(server, ADMIN, "mkdir", server["url"] + "/reports")
    locus(server, ADMIN, "put", str(src), server["url"] + "/reports/squares.csv")
    page = browser.new_page(viewport={"width": 1200, "height": 800}, accept_downloads=True)
    log_in(page, server, ADMIN)
    page.click("text=reports/")
    row = page.locator("#files-table tr[data-name='squares.csv']")
    expect(row).to_be_visible()
    expect(row).to_contain_text("KiB")
    row.locator("a").first.click()
    expect(page.locator("#preview-text")).to_contain_text("1999,3996001")
    page.screenshot(path=SHOTS / "files.png", full_page=False)
    with page.expect_download() as d:
        row.locator("a.download").click()
    assert Path(d.value.path()).read_text() == data
    assert d.value.suggested_filename == "squares.csv"

    upload = tmp_path / "notes.txt"
    upload.write_text("uploaded from the browser\n")
    page.set_input_files("#upload-input", str(upload))
    page.click("#upload-form button")
    expect(page.locator("#files-table tr[data-name='notes.txt']")).to_be_visible()
    assert (server["export"] / "reports" / "notes.txt").read_text() == "uploaded from the browser\n"
    page.close()


def test_the_load_plots_show_a_known_workload(server, browser, tmp_path):
    hot = tmp_path / "hot.bin"
    hot.write_text("0123456789abcdef" * (1 << 17))
    locus(server, ADMIN, "put", str(hot), server["url"] + "/hot.bin")
    for _ in range(5):
        locus(server, ADMIN, "cat", server["url"] + "/hot.bin")
        time.sleep(0.1)
    page = browser.new_page(viewport={"width": 1200, "height": 1300})
    log_in(page, server, ADMIN)
    page.goto(server["console"] + "#load")
    # The plots are drawn with data: the bytes read show, and the hot file heads the list.
    expect(page.locator("#busiest tbody tr").first).to_contain_text("/hot.bin")
    page.wait_for_function(
        "() => ['chart-bytes', 'chart-ops', 'chart-times', 'chart-heat', 'chart-file']"
        ".every(id => Number(document.getElementById(id).dataset.points) > 0)")
    read = page.evaluate(
        "() => Chart.getChart('chart-bytes').data.datasets[0].data.reduce((a, p) => a + p.y, 0)")
    assert read > 0
    heat_rows = page.evaluate("() => Chart.getChart('chart-heat').options.scales.y.labels")
    assert "/hot.bin" in heat_rows
    # The busiest file has its own plot; picking another file in the table plots that one.
    expect(page.locator("#file-caption")).to_contain_text("/hot.bin")
    page.locator("#busiest tbody tr").filter(has_text="squares.csv").click()
    expect(page.locator("#file-caption")).to_contain_text("/reports/squares.csv")
    page.locator("#busiest tbody tr").filter(has_text="/hot.bin").click()
    expect(page.locator("#file-caption")).to_contain_text("/hot.bin")
    page.wait_for_timeout(300)
    page.screenshot(path=SHOTS / "load.png", full_page=True)
    page.close()


SPIN = '(module (memory (export "memory") 1) (func (export "_start") (loop (br 0))))'
QUICK = '(module (memory (export "memory") 1) (func (export "_start")))'


def test_a_storelet_from_the_cli_is_listed_and_cancelled_and_others_do_not_see_it(server, browser, tmp_path):
    spin, quick = tmp_path / "spin.wat", tmp_path / "quick.wat"
    spin.write_text(SPIN)
    quick.write_text(QUICK)
    # Bob runs something quick of his own.
    locus(server, BOB, "storelet", "run", str(quick), "--dir", server["url"] + "/")
    running = subprocess.Popen(
        [LOCUS, "storelet", "run", str(spin), "--dir", server["url"] + "/", "--", "spinning"],
        env=dict(server["env"], LOCUS_TOKEN=ADMIN), stderr=subprocess.PIPE, text=True)
    page = browser.new_page(viewport={"width": 1200, "height": 800})
    log_in(page, server, ADMIN)
    page.goto(server["console"] + "#code")
    row = page.locator("#running tr[data-kind='storelet']")
    expect(row).to_contain_text("spinning")
    expect(row).to_contain_text("admin")
    expect(page.locator("#recent")).to_contain_text("bob")
    page.screenshot(path=SHOTS / "code.png", full_page=True)
    row.locator("button.cancel").click()
    _, err = running.communicate(timeout=20)
    assert running.returncode != 0 and "cancel" in err, err
    recent = page.locator("#recent tr[data-kind='storelet']").filter(has_text="spinning")
    expect(recent).to_contain_text("cancel")
    expect(page.locator("#running tbody tr")).to_have_count(0)
    page.close()

    # Bob sees his own run, and none of the admin's.
    context = browser.new_context(viewport={"width": 1200, "height": 800})
    page = context.new_page()
    log_in(page, server, BOB)
    page.goto(server["console"] + "#code")
    expect(page.locator("#code-status")).to_contain_text("Your runs")
    expect(page.locator("#recent tr[data-kind='storelet']")).to_have_count(1)
    expect(page.locator("#recent")).to_contain_text("bob")
    expect(page.locator("#recent")).not_to_contain_text("spinning")
    expect(page.locator("#recent")).not_to_contain_text("admin")
    context.close()
