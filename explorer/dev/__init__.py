"""Developer tools around the app (not part of it): responsiveness bench, load test, screenshots."""
