"""The dashboard in headless Chromium against a real master and real client processes."""
