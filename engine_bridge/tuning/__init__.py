"""Tuning by measurement: with our split reader (`split`) and with the real engine (`engine`)."""
