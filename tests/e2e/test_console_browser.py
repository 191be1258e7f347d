"""The web console in a real headless Chromium (Debian's chromium and chromium-driver,
installed by scripts/install-system-deps.sh; selenium from the test extras).

A ``trio-broker serve --metrics-listen 127.0.0.1:0 --console-writes`` subprocess while
confluent-kafka produces to it: the overview lists the broker, the live charts redraw
with new samples and show the produce rate, the topic, records and group pages render,
and a topic created with the console's form exists for confluent-kafka. With
``CONSOLE_SCREENSHOTS=DIR`` the pages are saved there as PNGs (docs/img/console-*.png
were made so). Skipped only when chromium or its driver is not installed.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.e2e.conftest import METRICS_LINE, BrokerProcess, running_broker

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.skipif(
        CHROMIUM is None or CHROMEDRIVER is None,
        reason="chromium and chromium-driver are not installed",
    ),
]
WAIT_S = 60.0


class ConsoleBroker(BrokerProcess):
    def command_line(self) -> list[str]:
        return [*super().command_line(), "--metrics-listen", "127.0.0.1:0", "--console-writes"]

    @property
    def console_url(self) -> str:
        [port, *_] = METRICS_LINE.findall(self.current_log())
        return f"http://127.0.0.1:{port}/"


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[ConsoleBroker]:
    with running_broker(tmp_path / "data", kind=ConsoleBroker) as process:
        yield process


@pytest.fixture
def driver() -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                 "--window-size=1280,900", "--disable-gpu"):  # fmt: skip
        options.add_argument(flag)
    chrome = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    try:
        yield chrome
    finally:
        chrome.quit()


def wait_until(what: str, check: Callable[[], Any]) -> Any:
    """Polls ``check`` until it returns something true (the page redraws on its own)."""
    deadline = time.monotonic() + WAIT_S
    while True:
        try:
            value = check()
        except Exception:  # the element is being redrawn; look again
            value = None
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)  # polling the browser, bounded by the deadline


def produce_steadily(bootstrap: str, stop: threading.Event) -> None:
    """About 100 records a second until told to stop (a load, not a synchronization)."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    i = 0
    while not stop.is_set() and i < 30_000:
        producer.produce("clicks", key=f"user-{i % 7}", value=f'{{"click": {i}}}')
        producer.poll(0)
        i += 1
        stop.wait(0.01)
    producer.flush(30)


def consume_steadily(bootstrap: str, stop: threading.Event) -> None:
    """Reads "clicks" as group "readers" until told to stop (the fetch rate's load)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "readers",
                         "auto.offset.reset": "earliest"})  # fmt: skip
    consumer.subscribe(["clicks"])
    try:
        while not stop.is_set():
            consumer.poll(0.2)
    finally:
        consumer.close()


def screenshot(driver: Any, name: str) -> None:
    folder = os.environ.get("CONSOLE_SCREENSHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(Path(folder) / f"console-{name}.png"))


def test_console_in_chromium(broker: ConsoleBroker, driver: Any) -> None:
    from selenium.webdriver.common.by import By

    bootstrap = broker.bootstrap
    admin = AdminClient({"bootstrap.servers": bootstrap})
    [future] = admin.create_topics([NewTopic("clicks", num_partitions=2)]).values()
    future.result(timeout=60)
    stop = threading.Event()
    loads = [threading.Thread(target=run, args=(bootstrap, stop), daemon=True)
             for run in (produce_steadily, consume_steadily)]  # fmt: skip
    for load in loads:
        load.start()
    try:
        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "dashboard",
                             "enable.auto.commit": False})  # fmt: skip
        consumer.commit(offsets=[TopicPartition("clicks", 0, 1)], asynchronous=False)
        consumer.close()

        driver.get(broker.console_url)
        rows = wait_until("the brokers table", lambda: driver.find_elements(
            By.CSS_SELECTOR, "#brokers tbody tr"))  # fmt: skip
        assert rows[0].find_elements(By.TAG_NAME, "td")[1].text == bootstrap
        # The live chart: new samples arrive and the produce rate shows the load.
        first = wait_until("a chart", lambda: driver.find_element(By.ID, "chart-rates"))
        points = first.find_element(By.TAG_NAME, "polyline").get_attribute("points")
        wait_until("the chart to redraw with more samples", lambda: int(
            driver.find_element(By.ID, "chart-rates").get_attribute("data-samples")) >= 5
            and driver.find_element(By.CSS_SELECTOR, "#chart-rates polyline")
            .get_attribute("points") != points)  # fmt: skip
        wait_until("a produce rate above zero", lambda: float(driver.find_element(
            By.CSS_SELECTOR, "#chart-rates .legend span").text.split()[1]) > 0)  # fmt: skip
        wait_until("a fetch rate above zero", lambda: float(driver.find_element(
            By.CSS_SELECTOR, "#chart-out .legend span").text.split()[1]) > 0)  # fmt: skip
        wait_until("latency drawn", lambda: len(driver.find_elements(
            By.CSS_SELECTOR, "#chart-latency polyline")) == 2)  # fmt: skip
        if os.environ.get("CONSOLE_SCREENSHOTS"):  # a fuller chart for the docs
            wait_until("30 samples", lambda: int(driver.find_element(
                By.ID, "chart-rates").get_attribute("data-samples")) >= 30)  # fmt: skip
        screenshot(driver, "overview")

        driver.get(broker.console_url + "#topics")
        wait_until("clicks in the topics table", lambda: "clicks" in driver.find_element(
            By.ID, "topics").text)  # fmt: skip
        driver.find_element(By.ID, "new-topic-name").send_keys("made-in-browser")
        partitions = driver.find_element(By.ID, "new-topic-partitions")
        partitions.clear()
        partitions.send_keys("3")
        driver.find_element(By.ID, "create-topic-button").click()
        wait_until("the creation", lambda: driver.find_element(
            By.ID, "create-result").text == "created made-in-browser")  # fmt: skip
        wait_until("the new topic listed", lambda: "made-in-browser" in driver.find_element(
            By.ID, "topics").text)  # fmt: skip
        screenshot(driver, "topics")
        metadata = admin.list_topics(timeout=10)
        assert len(metadata.topics["made-in-browser"].partitions) == 3

        driver.get(broker.console_url + "#topic/clicks")
        wait_until("the partitions", lambda: len(driver.find_elements(
            By.CSS_SELECTOR, "#partitions tbody tr")) == 2)  # fmt: skip
        assert "cleanup.policy" in driver.find_element(By.ID, "configs").text
        screenshot(driver, "topic")

        driver.get(broker.console_url + "#records/clicks/0/0")
        wait_until("records", lambda: '{"click": ' in driver.find_element(By.ID, "records").text)
        screenshot(driver, "records")

        driver.get(broker.console_url + "#group/dashboard")
        lag = wait_until("the group's lag", lambda: driver.find_elements(
            By.CSS_SELECTOR, "#lag tbody tr"))  # fmt: skip
        cells = [td.text for td in lag[0].find_elements(By.TAG_NAME, "td")]
        assert cells[:3] == ["clicks", "0", "1"] and int(cells[4]) > 0
        screenshot(driver, "group")
    finally:
        stop.set()
        for load in loads:
            load.join(timeout=60)
