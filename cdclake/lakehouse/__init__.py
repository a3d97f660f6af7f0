"""The Lakehouse page, an Airflow plugin: its FastAPI app and JSON API (``app``), the HTML
(``page``), the proof that an action comes from the page (``same_origin``) and each table's
status it shows (``status``).
"""
