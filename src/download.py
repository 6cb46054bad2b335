"""DVC stage `download`: every raw corpus file, checksum-verified, into data/raw/.

python src/download.py                         # canonical URLs
ATTNLAB_DATA_MIRROR=../shared/data python src/download.py   # offline mirror
"""
