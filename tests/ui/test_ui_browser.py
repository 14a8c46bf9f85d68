"""The inspector in a real headless Chromium: runs -> run -> snapshot on the demo's database.

Screenshots of each page are saved as build output (see conftest.py); they are not committed.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import WebDriverWait


def _wait(browser: Any) -> WebDriverWait[Any]:
    return WebDriverWait(browser, 60)


def _image_loaded(browser: Any, image: Any) -> bool:
    return bool(browser.execute_script('return arguments[0].complete && arguments[0].naturalWidth > 0', image))


def test_runs_to_run_to_snapshot(browser: Any, demo_ui: Any, shoot: Callable[[str], Path]) -> None:
    browser.get(demo_ui.base + '/')
    rows = _wait(browser).until(ec.presence_of_all_elements_located((By.CSS_SELECTOR, 'table.runs tbody tr')))
    listed = {row.find_element(By.CSS_SELECTOR, 'a.run-id').text: row for row in rows}
    assert set(listed) == {'report-run-1', 'report-run-1.research', 'report-run-2'}
    assert 'resumed by report-run-2 (completed)' in listed['report-run-1'].text
    assert 'unresolved' not in listed['report-run-1'].text  # its cut-short send_email was reconciled on resume
    shoot('1-runs')

    # the run: its send_email says how it was settled, with its key
    listed['report-run-1'].find_element(By.LINK_TEXT, 'report-run-1').click()
    ledger = _wait(browser).until(ec.presence_of_element_located((By.CSS_SELECTOR, '#ledger table')))
    assert ledger.find_elements(By.CSS_SELECTOR, 'tr.unresolved') == []
    row = ledger.find_element(By.XPATH, ".//tr[contains(., 'send_email')]")
    assert 'email::team@example.com::weekly-report' in row.text
    assert "email 'Weekly report' to team@example.com [settled on recovery: reconciled]" in row.text
    recovery = browser.find_element(By.ID, 'recovery').text
    assert 'Settled on recovery, with results in no snapshot of this run: call-email' in recovery
    # it was resumed: the page says by which run, and offers no second resumption, only a fork
    resumed = browser.find_element(By.ID, 'resumed-by').text
    assert 'Resumed by report-run-2 (completed): a resumed run is never resumed again' in resumed
    assert 'resumed by report-run-2 (completed)' in browser.find_element(By.ID, 'ownership').text
    assert browser.find_elements(By.ID, 'continuable') == []
    tree = browser.find_element(By.CSS_SELECTOR, '#lineage .tree')
    assert 'report-run-1.research' in tree.text
    assert "fork_run(store, run_id='report-run-1')" in browser.find_element(By.ID, 'snippet-1').text
    assert browser.find_elements(By.ID, 'snippet-2') == []
    shoot('2-run')

    # the timeline: the send_email call started, and ended when it was settled on recovery
    browser.find_element(By.LINK_TEXT, 'timeline').click()
    rows = _wait(browser).until(ec.presence_of_all_elements_located((By.CSS_SELECTOR, 'table.timeline tbody tr')))
    assert any('send_email' in r.text for r in rows)
    assert not any('send_email' in r.text for r in browser.find_elements(By.CSS_SELECTOR, 'table.timeline tr.open'))
    shoot('3-timeline')

    # the settled snapshot: a conversation with the chart inline and what changed since the one before
    browser.find_element(By.LINK_TEXT, 'snapshots').click()
    table = _wait(browser).until(ec.presence_of_element_located((By.CSS_SELECTOR, '#snapshots table')))
    assert [r.text.split()[2] for r in table.find_elements(By.CSS_SELECTOR, 'tbody tr')] == ['complete', 'complete']
    shoot('4-snapshots')
    table.find_elements(By.CSS_SELECTOR, 'tbody a')[-1].click()
    heading = _wait(browser).until(ec.presence_of_element_located((By.TAG_NAME, 'h1')))
    assert 'complete' in heading.text
    assert 'settled' in heading.text
    image = _wait(browser).until(ec.presence_of_element_located((By.CSS_SELECTOR, 'figure.media img')))
    _wait(browser).until(lambda _: _image_loaded(browser, image))
    assert browser.execute_script('return arguments[0].naturalWidth', image) == 224
    assert 'image/png' in browser.find_element(By.CSS_SELECTOR, 'figure.media figcaption').text
    assert '3 kept, 2 added' in browser.find_element(By.ID, 'diff').text
    added = browser.find_elements(By.CSS_SELECTOR, 'article.change-added')
    assert [a.get_attribute('id') for a in added] == ['m3', 'm4']
    calls = browser.find_elements(By.CSS_SELECTOR, '.part-tool-call')
    assert any('"question": "What happened this week?"' in c.text for c in calls)
    shoot('5-snapshot')


def test_stored_markup_is_shown_as_text(browser: Any, hostile_ui: Any, shoot: Callable[[str], Path]) -> None:
    browser.get(hostile_ui.base + '/runs/hostile-1')
    facts = _wait(browser).until(ec.presence_of_element_located((By.CSS_SELECTOR, '.facts')))
    assert '<i>scraper</i>' in facts.text
    browser.find_element(By.PARTIAL_LINK_TEXT, 'seq ').click()  # the newest snapshot
    _wait(browser).until(ec.presence_of_element_located((By.CSS_SELECTOR, '.conversation')))
    returns = browser.find_elements(By.CSS_SELECTOR, '.part-tool-return')
    assert any('<script>document.body.dataset.pwned = "script"</script>' in r.text for r in returns)
    assert browser.execute_script('return document.body.dataset.pwned') is None
    assert browser.find_elements(By.CSS_SELECTOR, '.conversation script') == []
    assert browser.find_elements(By.CSS_SELECTOR, '.conversation b') == []
    # the chart came back from the media store; the SVG is only offered as a download
    images = browser.find_elements(By.CSS_SELECTOR, 'figure.media img')
    assert len(images) == 1
    _wait(browser).until(lambda _: _image_loaded(browser, images[0]))
    assert 'image/svg+xml' in browser.find_element(By.CSS_SELECTOR, '.conversation').text
    # the retry the model was asked for
    assert any('the page was still loading' in r.text for r in browser.find_elements(By.CSS_SELECTOR, '.part-retry'))
    shoot('6-escaped')


def test_a_killed_run_shows_its_cut_short_call_with_arguments(
    browser: Any, killed_ui: Any, shoot: Callable[[str], Path]
) -> None:
    browser.get(killed_ui.base + '/runs/report-run-1')
    recovery = _wait(browser).until(ec.presence_of_element_located((By.ID, 'recovery')))
    [call] = recovery.find_elements(By.CSS_SELECTOR, '.unresolved-calls li')
    assert 'send_email (call-email) with arguments' in call.text
    args = call.find_element(By.CSS_SELECTOR, 'code.args').text
    assert json.loads(args) == {'to': 'team@example.com', 'subject': 'Weekly report', 'attachment': 'weekly-report.md'}
    verdict = browser.find_element(By.ID, 'continuable')
    assert 'It cannot be continued as is' in verdict.text
    assert 'stepcore recover report-run-1 --supply CALL=RESULT' in verdict.text
    highlighted = browser.find_elements(By.CSS_SELECTOR, '#ledger tr.unresolved')
    assert len(highlighted) == 1
    plain = browser.find_element(By.XPATH, "//*[@id='ledger']//tr[contains(., 'write_report')]")
    assert highlighted[0].value_of_css_property('background-color') != plain.value_of_css_property('background-color')
    shoot('7-killed')


def test_a_paused_run_shows_what_it_waits_for(browser: Any, waiting_ui: Any, shoot: Callable[[str], Path]) -> None:
    browser.get(waiting_ui.base + '/')
    rows = _wait(browser).until(ec.presence_of_all_elements_located((By.CSS_SELECTOR, 'table.runs tbody tr')))
    [row] = rows
    assert 'waiting' in row.find_element(By.CSS_SELECTOR, '.badge.status-waiting').text
    assert 'completed' not in row.text
    row.find_element(By.LINK_TEXT, 'approval-run-1').click()
    paused = _wait(browser).until(ec.presence_of_element_located((By.ID, 'paused')))
    assert 'Paused on 2 deferred tool calls' in paused.text
    drop = browser.find_element(By.ID, 'deferred-call-drop')
    assert 'drop_table' in drop.text
    assert 'approval' in drop.text
    assert json.loads(drop.find_element(By.CSS_SELECTOR, 'pre.args').text) == {'name': 'users', 'cascade': True}
    assert drop.find_element(By.CSS_SELECTOR, '.badge.waiting').text == 'waiting'
    assert drop.find_element(By.CSS_SELECTOR, 'td.when').text.strip() != '-'  # its deadline
    ask = browser.find_element(By.ID, 'deferred-call-ask')
    assert "result 'yes, keep one' by ops" in ask.text
    assert 'stepcore answer approval-run-1 CALL --approve' in paused.text
    assert 'waiting for answers to deferred tool calls' in browser.find_element(By.ID, 'ownership').text
    assert browser.find_elements(By.ID, 'continuable') == []
    snippet = browser.find_element(By.ID, 'snippet-1').text
    assert "approve_call(store, run_id='approval-run-1', tool_call_id='call-drop'" in snippet
    assert "resume_run(store, run_id='approval-run-1', agent=agent)" in snippet
    # count_rows ran beside the deferred calls: its entry is completed with the paused history
    assert browser.find_elements(By.CSS_SELECTOR, '#ledger tr.unresolved') == []
    shoot('8-waiting')
