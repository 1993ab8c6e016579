"""SAT Explorer: the Streamlit app (``streamlit run explorer/app.py``)."""
