#!/usr/bin/env python3
"""Drives Open WebUI in headless Chromium the way a person does, then checks what kvmem
recorded. Run by ops/frontend-check (which starts Postgres, kvmem, the logging proxy and
Open WebUI first); it needs Selenium, Debian's chromium and chromium-driver, and psql.

    drive.py --webui URL --kvmem URL --token T --database-url URL --proxy-log FILE
             --webui-db FILE --shots DIR --profiles DIR --results FILE
             --conversation match|header

Prints one PASS/FAIL line per check with its evidence, the per-turn figures and what
Open WebUI sent; writes the same as JSON to --results. Exits 1 when a check failed.
"""
import argparse
import json
import os
import re
import sqlite3
import subprocess
import sys
import time
import urllib.parse
import urllib.request

from selenium import webdriver
from selenium.common.exceptions import (ElementClickInterceptedException,
                                        ElementNotInteractableException,
                                        NoSuchElementException,
                                        StaleElementReferenceException,
                                        TimeoutException)
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import WebDriverWait

CHARACTER = "Guide"
TASK_MARKER = "### Task:"
A_NAME, A_EMAIL, A_PASSWORD = "Ada Admin", "ada@example.com", "ada-password-1"
B_NAME, B_EMAIL, B_PASSWORD = "Bob Second", "bob@example.com", "bob-password-2"
# The fact only the first account tells; the second must never see it.
SECRET = "Pixel"
MSG1 = f"Hello! My name is Ada and my cat is called {SECRET}."
MSG2 = "What is the name of my cat?"
MSG2_EDITED = "What colour do you think my cat is?"
MSG1_EDITED = "Hello! My name is Ada and I collect old maps."
MSG_NEW_CHAT = "Good morning. Can you recommend a room to visit first?"
MSG_B = "Hi, I am Bob. What is the name of my cat?"

T0 = time.time()


def log(msg):
    print(f"[{time.time() - T0:6.1f}s] {msg}", flush=True)


# ---------------------------------------------------------------- the proxy's log

class ProxyLog:
    def __init__(self, path):
        self.path = path

    def records(self):
        out = []
        if not os.path.exists(self.path):
            return out
        with open(self.path, encoding="utf-8") as f:
            for line in f:
                line = line.strip()
                if line:
                    try:
                        out.append(json.loads(line))
                    except ValueError:
                        pass
        return out

    def last_n(self):
        recs = self.records()
        return recs[-1]["n"] if recs else 0

    def wait_chat(self, since, text, timeout=600):
        """The first chat request after record `since` whose last user message is `text`,
        once kvmem's answer to it has ended."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            for r in self.records():
                if r["n"] > since and is_chat(r) and last_user(r) == text:
                    return r
            time.sleep(0.5)
        raise TimeoutError(f"no chat request with {text!r} reached kvmem in {timeout} s")


def is_chat(r):
    return r.get("method") == "POST" and r.get("path", "").split("?")[0].endswith("/chat/completions")


def messages_of(r):
    body = r.get("request_body")
    return body.get("messages") or [] if isinstance(body, dict) else []


def text_of(content):
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def last_user(r):
    for m in reversed(messages_of(r)):
        if m.get("role") == "user":
            return text_of(m.get("content"))
    return None


def is_task(r):
    return (last_user(r) or "").lstrip().startswith(TASK_MARKER)


def header(r, name, where="response_headers"):
    for k, v in (r.get(where) or {}).items():
        if k.lower() == name.lower():
            return v
    return None


def kvmem_block(r):
    body = r.get("response_body")
    if isinstance(body, dict) and body.get("stream"):
        for e in body.get("events", []):
            if isinstance(e, dict) and e.get("kvmem"):
                return e["kvmem"]
    elif isinstance(body, dict):
        return body.get("kvmem") or {}
    return {}


def reply_text(r):
    body = r.get("response_body")
    if isinstance(body, dict) and body.get("stream"):
        return body.get("text", "")
    if isinstance(body, dict):
        try:
            return body["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError):
            return ""
    return ""


# ---------------------------------------------------------------- Postgres

class Db:
    def __init__(self, url):
        self.url = url

    def rows(self, sql, *args):
        """Rows of `sql` as dicts; $1.. are filled from args as quoted literals."""
        for i, a in reversed(list(enumerate(args, 1))):
            if isinstance(a, (list, tuple)):
                lit = "ARRAY[" + ",".join(quote(x) for x in a) + "]::text[]" if a else "ARRAY[]::text[]"
            else:
                lit = quote(a)
            sql = sql.replace(f"${i}", lit)
        q = f"SELECT coalesce(json_agg(x), '[]'::json) FROM ({sql}) x"
        out = subprocess.run(["psql", self.url, "-XAtq", "-v", "ON_ERROR_STOP=1", "-c", q],
                             check=True, capture_output=True, text=True).stdout
        return json.loads(out or "[]")

    def one(self, sql, *args):
        r = self.rows(sql, *args)
        return r[0] if r else None


def quote(v):
    if v is None:
        return "NULL"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return str(v)
    return "'" + str(v).replace("'", "''") + "'"


# ---------------------------------------------------------------- the browser

class Browser:
    def __init__(self, name, base, shots, profile):
        self.name, self.base, self.shots = name, base.rstrip("/"), shots
        opts = Options()
        opts.binary_location = os.environ.get("CHROMIUM_BIN", "/usr/bin/chromium")
        for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                  "--disable-background-networking", "--window-size=1440,1000",
                  "--disable-extensions", "--no-first-run", "--lang=en-US",
                  f"--user-data-dir={profile}"):
            opts.add_argument(a)
        service = Service(os.environ.get("CHROMEDRIVER_BIN", "/usr/bin/chromedriver"))
        self.d = webdriver.Chrome(service=service, options=opts)
        self.d.set_page_load_timeout(120)

    def quit(self):
        try:
            self.d.quit()
        except Exception:  # noqa: BLE001 - best effort at exit
            pass

    def shot(self, label):
        Browser.counter = getattr(Browser, "counter", 0) + 1
        path = os.path.join(self.shots, f"{Browser.counter:02d}-{self.name}-{label}.png")
        self.d.save_screenshot(path)
        log(f"screenshot {path}")
        return path

    def wait(self, cond, timeout=60, what="element"):
        try:
            return WebDriverWait(self.d, timeout, poll_frequency=0.3).until(cond)
        except TimeoutException:
            self.shot("timeout")
            raise TimeoutError(f"{self.name}: timed out after {timeout} s waiting for {what}")

    def find(self, css, timeout=60):
        return self.wait(lambda d: visible(d, css), timeout, css)

    def click(self, el):
        try:
            el.click()
        except (ElementClickInterceptedException, ElementNotInteractableException):
            self.d.execute_script("arguments[0].click();", el)

    def click_text(self, tag, text, timeout=30):
        xp = f"//{tag}[normalize-space(.)={json.dumps(text)}]"
        el = self.wait(lambda d: next((e for e in d.find_elements(By.XPATH, xp) if e.is_displayed()), None),
                       timeout, f"{tag} '{text}'")
        self.click(el)

    def has_text(self, tag, text):
        xp = f"//{tag}[normalize-space(.)={json.dumps(text)}]"
        return any(e.is_displayed() for e in self.d.find_elements(By.XPATH, xp))

    def dismiss_modals(self):
        """The release notes ("What's New") a fresh account is shown, and any other modal."""
        for _ in range(3):
            time.sleep(1.0)
            done = False
            for label in ("Okay, Let's Go!", "Okay, Let\u2019s Go!", "Close"):
                xp = f"//button[contains(normalize-space(.), {json.dumps(label)})]"
                for e in self.d.find_elements(By.XPATH, xp):
                    if e.is_displayed():
                        self.click(e)
                        done = True
                        break
            if not done:
                try:
                    self.d.find_element(By.TAG_NAME, "body").send_keys(Keys.ESCAPE)
                except NoSuchElementException:
                    pass
                return

    def toasts(self):
        out = []
        for e in self.d.find_elements(By.CSS_SELECTOR, "[data-sonner-toast]"):
            try:
                t = e.text.strip()
            except StaleElementReferenceException:
                continue
            if t:
                out.append(t)
        return out

    # ---- accounts
    def sign_up_admin(self):
        self.d.get(self.base + "/auth")
        self.wait(lambda d: d.find_elements(By.CSS_SELECTOR, "#auth-page"), 120, "the sign-in page")
        time.sleep(1.5)
        for e in self.d.find_elements(By.XPATH, "//button[@aria-label='Get started']"):
            if e.is_displayed():
                self.shot("onboarding")
                self.click(e)
        self.find("#name").send_keys(A_NAME)
        self.find("#email").send_keys(A_EMAIL)
        self.find("#password").send_keys(A_PASSWORD)
        for e in self.d.find_elements(By.CSS_SELECTOR, "#confirm-password"):
            e.send_keys(A_PASSWORD)
        self.shot("sign-up")
        self.click_text("button", "Create Admin Account")
        self.wait_chat_page()

    def sign_in(self, email, password):
        self.d.get(self.base + "/auth")
        self.find("#email").send_keys(email)
        self.find("#password").send_keys(password)
        self.click_text("button", "Sign in")
        self.wait_chat_page()

    def wait_chat_page(self):
        self.wait(lambda d: "/auth" not in d.current_url and visible(d, "#chat-input"), 120,
                  "the chat page after signing in")
        self.dismiss_modals()

    def add_user(self, name, email, password):
        """Admin panel, Users, Add User: the way an admin makes a second account."""
        self.d.get(self.base + "/admin/users")
        self.click_text("button", "Add User", 60)
        self.find("input[placeholder='Enter Your Full Name']").send_keys(name)
        self.find("input[placeholder='Enter Your Email']").send_keys(email)
        self.find("input[placeholder='Enter Your Password']").send_keys(password)
        self.shot("add-user")
        self.click_text("button", "Save")
        self.wait(lambda d: email in d.page_source and not visible(d, "input[placeholder='Enter Your Email']"),
                  30, "the new user in the list")

    # ---- chat
    def pick_model(self, name):
        """Opens the model menu (in the message box in 0.12) and picks the character, as a
        person does, even when it is already the one selected."""
        sel = "button[id^='model-selector-'][id$='-button']"
        self.click(self.find(sel))
        opt_css = f"[role='option'][data-value='{name}']"
        try:
            opt = self.find(opt_css, 10)
        except TimeoutError:
            search = self.find("#model-search-input", 10)
            search.send_keys(name)
            opt = self.find(opt_css, 20)
        self.shot("model-menu")
        self.click(opt)

        def chosen(d):
            b = visible(d, sel)
            return b is not None and name in ((b.get_attribute("aria-label") or "") + (b.text or ""))
        self.wait(chosen, 20, f"model {name} selected")
        self.dismiss_menus()

    def dismiss_menus(self):
        if visible(self.d, "#model-selector-list"):
            self.d.find_element(By.TAG_NAME, "body").send_keys(Keys.ESCAPE)

    def send(self, text):
        box = self.find("#chat-input")
        self.click(box)
        box.send_keys(text)
        time.sleep(0.3)
        box.send_keys(Keys.ENTER)

    def assistant_blocks(self):
        return self.d.find_elements(By.CSS_SELECTOR, ".chat-assistant")

    def user_blocks(self):
        return self.d.find_elements(By.CSS_SELECTOR, ".user-message")

    def wait_reply_shown(self, reply, timeout=90):
        """The last assistant message shows (the start of) kvmem's reply and is done (its
        Regenerate button is there)."""
        probe = norm(reply)[:40]

        def ok(d):
            blocks = d.find_elements(By.CSS_SELECTOR, ".chat-assistant")
            if not blocks:
                return False
            last = blocks[-1]
            try:
                shown = norm(last.text)
                done = last.find_elements(By.XPATH, "ancestor::*[starts-with(@id,'message-')][1]"
                                                    "//button[@aria-label='Regenerate']")
            except StaleElementReferenceException:
                return False
            return (probe in shown) and bool(done)
        self.wait(ok, timeout, "the reply on the page")
        return norm(self.assistant_blocks()[-1].text)

    def regenerate_last(self):
        blocks = self.assistant_blocks()
        msg = blocks[-1].find_element(By.XPATH, "ancestor::*[starts-with(@id,'message-')][1]")
        ActionChains(self.d).move_to_element(msg).perform()
        btns = msg.find_elements(By.XPATH, ".//button[@aria-label='Regenerate']")
        self.click(btns[-1])
        time.sleep(0.8)
        if self.has_text("button", "Try Again"):
            self.shot("regenerate-menu")
            self.click_text("button", "Try Again")
        else:  # the menu is off: the plain button regenerates
            hidden = msg.find_elements(By.CSS_SELECTOR, ".regenerate-response-button")
            if hidden:
                self.d.execute_script("arguments[0].click();", hidden[-1])

    def edit_user_message(self, index, new_text):
        msg = self.user_blocks()[index]
        self.d.execute_script("arguments[0].scrollIntoView({block: 'center'});", msg)
        ActionChains(self.d).move_to_element(msg).perform()
        time.sleep(0.4)
        btn = msg.find_element(By.CSS_SELECTOR, "button.edit-user-message-button")
        self.click(btn)
        area = self.find("textarea[id^='message-edit-']", 20)
        area.send_keys(Keys.CONTROL, "a")
        area.send_keys(Keys.DELETE)
        area.send_keys(new_text)
        self.shot(f"edit-message-{index + 1}")
        self.click(self.find("#confirm-edit-message-button", 10))

    def new_chat(self):
        btns = [e for e in self.d.find_elements(By.CSS_SELECTOR, "#sidebar-new-chat-button") if e.is_displayed()]
        if btns:
            self.click(btns[0])
        else:
            self.d.execute_script("document.getElementById('sidebar-new-chat-button').click();")
        self.wait(lambda d: not d.find_elements(By.CSS_SELECTOR, ".chat-assistant"), 30, "an empty chat")
        self.find("#chat-input")

    def sidebar_titles(self):
        out = []
        for e in self.d.find_elements(By.CSS_SELECTOR, "[data-sidebar-chat-id]"):
            try:
                out.append({"chat_id": e.get_attribute("data-sidebar-chat-id"), "title": e.text.strip()})
            except StaleElementReferenceException:
                pass
        return out

    def sibling_counter(self):
        """The "2/2" a message shows when it has versions (regenerate, edit)."""
        return self.d.execute_script("""
            const out = [];
            for (const e of document.querySelectorAll('[id^="message-"] *')) {
                if (e.children.length === 0 && /^\\s*\\d+\\s*\\/\\s*\\d+\\s*$/.test(e.textContent)
                    && e.offsetParent !== null) {
                    out.push(e.textContent.replace(/\\s/g, ''));
                }
            }
            return out;""")


def visible(d, css):
    for e in d.find_elements(By.CSS_SELECTOR, css):
        try:
            if e.is_displayed():
                return e
        except StaleElementReferenceException:
            pass
    return None


def norm(s):
    return re.sub(r"\s+", " ", s or "").strip()


# ---------------------------------------------------------------- the run

class Run:
    def __init__(self, a):
        self.a = a
        self.log = ProxyLog(a.proxy_log)
        self.db = Db(a.database_url)
        self.steps = {}      # step name -> proxy record of its chat request
        self.ui = {}         # step name -> what the page showed
        self.checks = []
        self.shots = []
        self.notes = []

    def chat_step(self, br, step, text, action):
        since = self.log.last_n()
        t = time.time()
        action()
        rec = self.log.wait_chat(since, text)
        shown = br.wait_reply_shown(reply_text(rec)) if rec.get("status") == 200 else None
        rec["_ui_s"] = round(time.time() - t, 1)
        self.steps[step] = rec
        self.ui[step] = {"reply_shown": shown}
        log(f"{step}: {rec.get('status')} {header(rec, 'x-kvmem-conversation')} "
            f"session={header(rec, 'x-kvmem-session')} total={rec.get('total_ms')} ms")
        # Open WebUI's background requests (title, tags, follow-ups) come after the reply.
        time.sleep(6)
        self.ui[step]["toasts"] = br.toasts()
        self.ui[step]["sidebar"] = br.sidebar_titles()
        self.ui[step]["page_title"] = br.d.title
        return rec

    def check(self, name, ok, evidence):
        self.checks.append({"check": name, "pass": bool(ok), "evidence": evidence})
        print(f"{'PASS' if ok else 'FAIL'}  {name}\n      {evidence}", flush=True)

    def drive(self):
        a = self.a
        os.makedirs(a.shots, exist_ok=True)
        A = Browser("ada", a.webui, a.shots, os.path.join(a.profiles, "ada"))
        try:
            log("ada: sign up (the first account becomes admin)")
            A.sign_up_admin()
            self.shots.append(A.shot("signed-in"))
            A.pick_model(CHARACTER)
            self.chat_step(A, "first", MSG1, lambda: A.send(MSG1))
            self.shots.append(A.shot("first-reply"))
            self.chat_step(A, "second", MSG2, lambda: A.send(MSG2))
            self.shots.append(A.shot("second-reply"))
            self.ui["second"]["before_regenerate"] = norm(A.assistant_blocks()[-1].text)
            self.chat_step(A, "regenerate", MSG2, A.regenerate_last)
            self.ui["regenerate"]["counters"] = A.sibling_counter()
            self.shots.append(A.shot("regenerated"))
            self.chat_step(A, "edit_second", MSG2_EDITED, lambda: A.edit_user_message(1, MSG2_EDITED))
            self.ui["edit_second"]["counters"] = A.sibling_counter()
            self.shots.append(A.shot("edited-second"))
            self.chat_step(A, "edit_first", MSG1_EDITED, lambda: A.edit_user_message(0, MSG1_EDITED))
            self.ui["edit_first"]["counters"] = A.sibling_counter()
            self.shots.append(A.shot("edited-first"))
            A.new_chat()
            A.pick_model(CHARACTER)
            self.chat_step(A, "new_chat", MSG_NEW_CHAT, lambda: A.send(MSG_NEW_CHAT))
            self.shots.append(A.shot("new-chat"))
            log("ada: adds a second account in the admin panel")
            A.add_user(B_NAME, B_EMAIL, B_PASSWORD)
            self.shots.append(A.shot("users"))
        finally:
            A.quit()
        B = Browser("bob", a.webui, a.shots, os.path.join(a.profiles, "bob"))
        try:
            log("bob: sign in, same character")
            B.sign_in(B_EMAIL, B_PASSWORD)
            B.pick_model(CHARACTER)
            self.chat_step(B, "second_account", MSG_B, lambda: B.send(MSG_B))
            self.shots.append(B.shot("second-account"))
        finally:
            B.quit()

    # ---- the checks
    def verify(self):
        a, s = self.a, self.steps
        conv = {k: header(r, "x-kvmem-conversation") for k, r in s.items()}
        sess = {k: header(r, "x-kvmem-session") for k, r in s.items()}
        turn = {k: kvmem_block(r).get("turn_id") for k, r in s.items()}
        named = a.conversation == "header"

        def tlog(step):
            return self.db.one("SELECT cold, loaded, cold_reason, tokens_loaded, latency_ms, ttft_ms, "
                               "prefill_ms, generate_ms FROM turn_log WHERE turn_id = $1 "
                               "ORDER BY attempt DESC LIMIT 1", turn[step]) or {}

        def family(session):
            if not session:
                return []
            r = self.db.one("SELECT kvmem_session_family($1) AS f", session)
            return r["f"] if r else []

        for step, r in s.items():
            if r.get("status") != 200:
                body = r.get("response_body")
                err = body.get("error") if isinstance(body, dict) else None
                msg = err.get("message") if isinstance(err, dict) else body
                print(f"NOTE  the {step} request got {r.get('status')} from kvmem: {msg}", flush=True)

        owui_users = webui_users(a.webui_db)
        uid_a = owui_users.get(A_EMAIL)
        uid_b = owui_users.get(B_EMAIL)

        # 1. the second message continues warm
        t2 = tlog("second")
        want = "named" if named else "continued"
        self.check("a second message continues the session, warm",
                   conv["second"] == want and sess["second"] == sess["first"]
                   and t2.get("cold") is False and t2.get("loaded") is True,
                   f"first: {conv['first']} session {sess['first']} turn {turn['first']} "
                   f"cold={tlog('first').get('cold')}; second: x-kvmem-conversation={conv['second']}, "
                   f"same session={sess['second'] == sess['first']}, turn_log cold={t2.get('cold')} "
                   f"loaded={t2.get('loaded')} tokens_loaded={t2.get('tokens_loaded')} "
                   f"cached_tokens={cached(s['second'])}")

        # 2. regenerate replaces the reply
        before = self.ui["second"].get("before_regenerate") or ""
        after = self.ui["regenerate"].get("reply_shown") or ""
        regen_turn = self.db.one("SELECT session_id, message, reply, state, origin FROM turns WHERE id = $1",
                                 turn["regenerate"]) or {}
        old_turn = self.db.one("SELECT session_id, state, reply FROM turns WHERE id = $1", turn["second"]) or {}
        if named:
            ok = conv["regenerate"] == "named" and sess["regenerate"] == sess["first"]
            how = f"x-kvmem-conversation={conv['regenerate']}, session {sess['regenerate']} (the chat's)"
        else:
            fam = family(sess["first"])
            copies = self.db.rows("SELECT id, copied_from, origin FROM turns WHERE session_id = $1 "
                                  "AND origin = 'branch' ORDER BY id", sess["regenerate"])
            ok = (conv["regenerate"] == "branched" and sess["regenerate"] != sess["first"]
                  and sess["regenerate"] in fam and copies)
            how = (f"x-kvmem-conversation={conv['regenerate']}, new session {sess['regenerate']} "
                   f"in kvmem_session_family(first)={sess['regenerate'] in fam}, branch copies "
                   f"{[(c['id'], c['copied_from']) for c in copies]}")
        ok = ok and regen_turn.get("state") == "done" and norm(regen_turn.get("reply"))[:40] in after \
            and old_turn.get("state") == "done"
        self.check("regenerate replaces the reply on the page; kvmem continues the chat's session"
                   if named else "regenerate replaces the reply (a branch)",
                   ok, f"{how}; new turn {turn['regenerate']} for the same message; the page shows "
                   f"the new reply (versions {self.ui['regenerate'].get('counters')}); reply before "
                   f"{before[:60]!r}, after {after[:60]!r} ({'same text' if before == after else 'different text'}); "
                   f"the first reply's turn {turn['second']} stays {old_turn.get('state')}")

        # 3. editing the second message branches at the turn before it
        fam = family(sess["first"])
        if named:
            ok = conv["edit_second"] == "named" and sess["edit_second"] == sess["first"]
        else:
            ok = conv["edit_second"] == "branched" and sess["edit_second"] in fam \
                and sess["edit_second"] not in (sess["first"], sess["regenerate"])
        self.check("editing the second message continues the chat's session"
                   if named else "editing the second message branches",
                   ok, f"x-kvmem-conversation={conv['edit_second']}, session {sess['edit_second']}, "
                   f"in the first session's family={sess['edit_second'] in fam}; page versions "
                   f"{self.ui['edit_second'].get('counters')}")

        # 4. editing the first message: a new session (docs: nothing before it to branch at)
        if named:
            ok = conv["edit_first"] == "named" and sess["edit_first"] == sess["first"]
            exp = "named: the chat's session"
        else:
            ok = conv["edit_first"] == "started" and sess["edit_first"] not in fam
            exp = "started: a new session, no branch (docs/http-api.md: an edit of the first message starts a new session)"
        hist = self.db.rows("SELECT id, origin, message FROM turns WHERE session_id = $1 ORDER BY id",
                            sess["edit_first"])
        self.check("editing the first message continues the chat's session"
                   if named else "editing the first message starts its own session",
                   ok, f"expected {exp}; got x-kvmem-conversation={conv['edit_first']}, session "
                   f"{sess['edit_first']}, its turns {[(h['id'], h['origin'], h['message'][:30]) for h in hist]}; "
                   f"page versions {self.ui['edit_first'].get('counters')}")

        # 5. a new chat is a new session
        earlier = {sess[k] for k in ("first", "regenerate", "edit_second", "edit_first")}
        self.check("a new chat is a new session",
                   conv["new_chat"] in ("started", "named") and sess["new_chat"] not in earlier,
                   f"x-kvmem-conversation={conv['new_chat']}, session {sess['new_chat']}, "
                   f"not one of the first chat's {len(earlier)} sessions; chat id header "
                   f"{header(s['new_chat'], 'x-openwebui-chat-id', 'request_headers')} vs first chat's "
                   f"{header(s['first'], 'x-openwebui-chat-id', 'request_headers')}")

        # 6. the second account sees none of the first account's memory
        mem_a = self.db.one("SELECT count(*) AS n FROM memory_messages WHERE user_id = $1", uid_a)["n"]
        mem_b = self.db.rows("SELECT speaker, text FROM memory_messages WHERE user_id = $1 ORDER BY id", uid_b)
        leak_b = [m for m in mem_b if SECRET.lower() in m["text"].lower()]
        b_rows_user = self.db.rows("SELECT DISTINCT user_id FROM turns WHERE session_id = $1", sess["second_account"])
        search_a = memory_search(a.kvmem, a.token, uid_a, SECRET)
        search_b = memory_search(a.kvmem, a.token, uid_b, SECRET)
        b_reply = reply_text(s["second_account"])
        b_log = tlog("second_account")
        self.check("a second account sees none of the first account's memory",
                   uid_b and uid_a != uid_b and header(s["second_account"], "x-openwebui-user-id", "request_headers") == uid_b
                   and [r["user_id"] for r in b_rows_user] == [uid_b]
                   and search_a["hits"] > 0 and search_b["hits"] == 0
                   and not leak_b and SECRET.lower() not in b_reply.lower()
                   and sess["second_account"] not in set(sess.values()) - {sess["second_account"]},
                   f"Open WebUI ids: ada {uid_a}, bob {uid_b}; bob's request header x-openwebui-user-id="
                   f"{header(s['second_account'], 'x-openwebui-user-id', 'request_headers')}; bob's turn rows' "
                   f"user_id {[r['user_id'] for r in b_rows_user]}; memory_messages: ada {mem_a}, bob {len(mem_b)}; "
                   f"/v1/memory/search q={SECRET}: as ada {search_a['hits']} hits, as bob {search_b['hits']} "
                   f"({search_b.get('status')}); bob's reply mentions {SECRET}: {SECRET.lower() in b_reply.lower()}; "
                   f"bob's turn cold={b_log.get('cold')} ({b_log.get('cold_reason')})")

        # 7. background tasks never became turns or memories
        recs = self.log.records()
        tasks = [r for r in recs if is_chat(r) and is_task(r)]
        kinds = {}
        for r in tasks:
            k = task_kind(last_user(r))
            st = f"{r.get('status')} {error_type(r)}"
            kinds.setdefault(k, {}).setdefault(st, 0)
            kinds[k][st] += 1
        task_turns = self.db.one("SELECT count(*) AS n FROM turns WHERE message LIKE '### Task:%'")["n"]
        task_mem = self.db.one("SELECT count(*) AS n FROM memory_messages WHERE text LIKE '### Task:%'")["n"]
        task_mem2 = self.db.one("SELECT count(*) AS n FROM memories WHERE text LIKE '%### Task:%'")["n"]
        self.check("Open WebUI's background requests became no turn and no memory",
                   tasks and all(r.get("status") == 400 and error_type(r) == "background_task" for r in tasks)
                   and task_turns == 0 and task_mem == 0 and task_mem2 == 0,
                   f"{len(tasks)} task requests reached kvmem: {kinds}; turns with '### Task:' {task_turns}, "
                   f"memory_messages {task_mem}, memories {task_mem2}; after the first reply the page's "
                   f"title is {self.ui['first'].get('page_title')!r}, toasts {self.ui['first'].get('toasts')}")

        # 8. every chat request named the user by the header kvmem reads
        chats = [r for r in recs if is_chat(r)]
        bad = [r["n"] for r in chats if header(r, "x-openwebui-user-id", "request_headers") not in (uid_a, uid_b)]
        db_users = [r["user_id"] for r in self.db.rows("SELECT DISTINCT user_id FROM turns ORDER BY 1")]
        self.check("every chat request carries the Open WebUI user id, and kvmem's rows are keyed by it",
                   not bad and set(db_users) <= {uid_a, uid_b},
                   f"{len(chats)} chat requests, {len(bad)} without a known x-openwebui-user-id; turns.user_id "
                   f"values {db_users}")

        self.figures(tlog)
        self.observed(recs)

    def figures(self, tlog):
        print("\nturns (from the proxy's log and turn_log):")
        print(f"  {'step':<16}{'how':<11}{'turn':>5} {'cold':<6}{'tokens_loaded':>14}{'ttft_ms':>9}"
              f"{'turn_ms':>9}{'http_ms':>9}{'first_text_ms':>14}{'page_s':>8}")
        rows = []
        for step, r in self.steps.items():
            t = tlog(step)
            row = {"step": step, "how": header(r, "x-kvmem-conversation"), "turn": kvmem_block(r).get("turn_id"),
                   "cold": t.get("cold"), "cold_reason": t.get("cold_reason"),
                   "tokens_loaded": t.get("tokens_loaded"), "ttft_ms": t.get("ttft_ms"),
                   "turn_ms": t.get("latency_ms"), "http_ms": r.get("total_ms"),
                   "first_text_ms": r.get("first_content_ms"), "page_s": r.get("_ui_s")}
            rows.append(row)
            print(f"  {step:<16}{str(row['how']):<11}{str(row['turn']):>5} {str(row['cold']):<6}"
                  f"{str(row['tokens_loaded']):>14}{str(row['ttft_ms']):>9}{str(row['turn_ms']):>9}"
                  f"{str(row['http_ms']):>9}{str(row['first_text_ms']):>14}{str(row['page_s']):>8}")
        self.turn_rows = rows

    def observed(self, recs):
        """What Open WebUI sent kvmem, summarised."""
        chats = [r for r in recs if is_chat(r)]
        other = [f"{r['method']} {r['path']} -> {r.get('status')}" for r in recs if not is_chat(r)]
        hdr_names = set()
        body_keys = set()
        systems = set()
        models = set()
        streams = set()
        for r in chats:
            hdr_names |= {k.lower() for k in (r.get("request_headers") or {})}
            b = r.get("request_body") if isinstance(r.get("request_body"), dict) else {}
            body_keys |= set(b)
            models.add(b.get("model"))
            streams.add(b.get("stream"))
            for m in messages_of(r):
                if m.get("role") in ("system", "developer"):
                    systems.add(text_of(m.get("content"))[:200])
        task_examples = {}
        for r in chats:
            if is_task(r):
                task_examples.setdefault(task_kind(last_user(r)), {
                    "first_line": (last_user(r) or "").splitlines()[0][:120],
                    "messages": [m.get("role") for m in messages_of(r)],
                    "stream": (r.get("request_body") or {}).get("stream"),
                    "answer": f"{r.get('status')} {error_type(r)}"})
        chat_id_hdr = [header(r, "x-openwebui-chat-id", "request_headers") for r in chats]
        self.seen = {
            "chat_requests": len(chats),
            "other_requests": sorted(set(other)),
            "request_header_names": sorted(hdr_names),
            "body_fields": sorted(body_keys),
            "models": sorted(m for m in models if m),
            "stream": sorted(str(x) for x in streams),
            "system_messages": sorted(systems),
            "chat_id_header_sent": sum(1 for c in chat_id_hdr if c),
            "task_requests": task_examples,
        }
        print("\nevery request Open WebUI sent kvmem (the proxy's log; s after the first):")
        t0 = recs[0]["at"] if recs else 0
        for r in recs:
            b = r.get("request_body") if isinstance(r.get("request_body"), dict) else {}
            roles = "".join((m.get("role") or "?")[0] for m in messages_of(r))
            what = task_kind(last_user(r)) + " task" if is_chat(r) and is_task(r) else \
                (repr((last_user(r) or "")[:40]) if is_chat(r) else "")
            print(f"  {r['n']:>3} {r['at'] - t0:6.1f}s {r['method']} {r['path'].split('?')[0]} -> "
                  f"{r.get('status')} {error_type(r) or header(r, 'x-kvmem-conversation') or ''} "
                  f"{r.get('total_ms')} ms; user {str(header(r, 'x-openwebui-user-id', 'request_headers'))[:8]} "
                  f"chat {str(header(r, 'x-openwebui-chat-id', 'request_headers'))[:8]} "
                  f"stream={b.get('stream')} max_tokens={b.get('max_tokens')} messages={roles} {what}")
        print("\nwhat Open WebUI sent kvmem, in sum:")
        for k, v in self.seen.items():
            print(f"  {k}: {json.dumps(v, ensure_ascii=False)}")


def cached(r):
    body = r.get("response_body")
    if isinstance(body, dict):
        for e in body.get("events", []) if body.get("stream") else [body]:
            if isinstance(e, dict) and e.get("usage"):
                return (e["usage"].get("prompt_tokens_details") or {}).get("cached_tokens")
            if isinstance(e, dict) and e.get("kvmem", {}).get("cached_tokens") is not None:
                return e["kvmem"]["cached_tokens"]
    return None


def error_type(r):
    b = r.get("response_body")
    if isinstance(b, dict) and isinstance(b.get("error"), dict):
        return b["error"].get("type") or b["error"].get("code")
    return None


def task_kind(text):
    t = (text or "").lower()
    for k, name in (("title", "title"), ("tags", "tags"), ("follow-up", "follow-ups"),
                    ("predict 3-5 useful messages", "follow-ups"), ("query", "query"),
                    ("autocomplete", "autocomplete"), ("emoji", "emoji")):
        if k in t[:400]:
            return name
    return "other"


def webui_users(path):
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return {email: uid for uid, email in con.execute('SELECT id, email FROM "user"')}
    finally:
        con.close()


def memory_search(kvmem, token, user, q):
    url = f"{kvmem}/v1/memory/search?" + urllib.parse.urlencode({"q": q, "limit": 20})
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}", "x-openwebui-user-id": user})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            body = json.load(resp)
            status = resp.status
    except urllib.error.HTTPError as e:
        return {"hits": -1, "status": e.code, "body": e.read().decode()[:300]}
    hits = body.get("hits") if isinstance(body, dict) else body
    if hits is None and isinstance(body, dict):
        hits = (body.get("memories") or []) + (body.get("messages") or [])
    found = [h for h in hits or [] if q.lower() in json.dumps(h).lower()]
    return {"hits": len(found), "status": status}


def main():
    p = argparse.ArgumentParser()
    for name in ("webui", "kvmem", "token", "database-url", "proxy-log", "webui-db", "shots",
                 "profiles", "results"):
        p.add_argument("--" + name, required=True)
    p.add_argument("--conversation", choices=("match", "header"), default="match")
    a = p.parse_args()
    run = Run(a)
    error = None
    try:
        run.drive()
    except Exception as e:  # noqa: BLE001 - reported, then the checks run on what there is
        error = f"{type(e).__name__}: {e}"
        log(f"the browser run stopped: {error}")
    if error is None:
        time.sleep(5)  # the memory lane indexes the last turns off the turn's path
        try:
            run.verify()
        except Exception as e:  # noqa: BLE001
            error = f"verify: {type(e).__name__}: {e}"
            log(error)
    result = {"error": error, "checks": run.checks, "turns": getattr(run, "turn_rows", []),
              "seen": getattr(run, "seen", {}), "ui": run.ui, "screenshots": run.shots,
              "steps": {k: {"n": r["n"], "conversation": header(r, "x-kvmem-conversation"),
                            "session": header(r, "x-kvmem-session"), "reply": reply_text(r)}
                        for k, r in run.steps.items()}}
    with open(a.results, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1, ensure_ascii=False)
    failed = error is not None or not run.checks or any(not c["pass"] for c in run.checks)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
