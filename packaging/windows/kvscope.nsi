; KVScope's Windows installer: a per-user install (no admin rights) of the PyInstaller bundle.
;
;   makensis /DVERSION=0.1.0 /DSRCDIR=C:\path\to\dist\kvscope /DOUTFILE=C:\path\KVScope-0.1.0-setup.exe ^
;            packaging\windows\kvscope.nsi
;
; VERSION  the version from pyproject.toml (packaging/project_version.py prints it)
; SRCDIR   the one-folder bundle: kvscope.exe and _internal\  (default: ..\..\dist\kvscope)
; OUTFILE  where the installer goes                  (default: ..\..\dist\KVScope-VERSION-setup.exe)
; Relative paths are relative to this file's folder (makensis changes into it).
;
; Installs to %LOCALAPPDATA%\Programs\KVScope, adds Start-menu and desktop shortcuts and an entry
; in "Installed apps" (HKCU). The uninstaller removes exactly what was installed; the user's chats,
; settings and caches (%LOCALAPPDATA%\KVScope) are kept.
;
; NSIS cannot hold more than 2 GB of payload: fine for the CPU bundle, too small for a CUDA torch
; bundle, which the release workflow ships as a split archive instead (see packaging/README.md).

Unicode true
SetCompressor /SOLID lzma
SetCompressorDictSize 64

!ifndef VERSION
  !error "pass the version: makensis /DVERSION=x.y.z ..."
!endif
!ifndef SRCDIR
  !define SRCDIR "..\..\dist\kvscope"
!endif
!ifndef OUTFILE
  !define OUTFILE "..\..\dist\KVScope-${VERSION}-setup.exe"
!endif
!ifndef ICON
  !define ICON "..\..\assets\kvscope.ico"
!endif

!define APPNAME "KVScope"
!define EXENAME "kvscope.exe"
!define PUBLISHER "KVScope"
!define UNINSTKEY "Software\Microsoft\Windows\CurrentVersion\Uninstall\${APPNAME}"

; VIProductVersion needs four numbers: pass /DVERSION_NUMERIC=x.y.z.0, or it is made from VERSION by
; dropping a pre-release/local tail (0.1.0rc1, 2.0.1a3, 1.0.0+cpu -> x.y.z.0; 1.2 -> 1.2.0.0).
!ifndef VERSION_NUMERIC
  !searchparse /noerrors "${VERSION}" "" VER_MAJOR "." VER_MINOR "." VER_PATCH_RAW
  !ifndef VER_MINOR
    !define VER_MINOR "0"
  !endif
  !ifndef VER_PATCH_RAW
    !define VER_PATCH_RAW "0"
  !endif
  !searchreplace VER_P1 "${VER_PATCH_RAW}" "rc" "."
  !searchreplace VER_P2 "${VER_P1}" "a" "."
  !searchreplace VER_P3 "${VER_P2}" "b" "."
  !searchreplace VER_P4 "${VER_P3}" "+" "."
  !searchparse /noerrors "${VER_P4}." "" VER_PATCH "."
  !define VERSION_NUMERIC "${VER_MAJOR}.${VER_MINOR}.${VER_PATCH}.0"
!endif

Name "${APPNAME} ${VERSION}"
OutFile "${OUTFILE}"
RequestExecutionLevel user
InstallDir "$LOCALAPPDATA\Programs\${APPNAME}"
InstallDirRegKey HKCU "Software\${APPNAME}" "InstallDir"
BrandingText "${APPNAME} ${VERSION}"

VIProductVersion "${VERSION_NUMERIC}"
VIAddVersionKey "ProductName" "${APPNAME}"
VIAddVersionKey "ProductVersion" "${VERSION}"
VIAddVersionKey "FileVersion" "${VERSION}"
VIAddVersionKey "FileDescription" "${APPNAME} installer"
VIAddVersionKey "CompanyName" "${PUBLISHER}"
VIAddVersionKey "LegalCopyright" "Apache-2.0"

!include "MUI2.nsh"
!define MUI_ICON "${ICON}"
!define MUI_UNICON "${ICON}"
!define MUI_ABORTWARNING
!define MUI_FINISHPAGE_RUN "$INSTDIR\${EXENAME}"
!define MUI_FINISHPAGE_RUN_TEXT "Start ${APPNAME}"

!insertmacro MUI_PAGE_WELCOME
!insertmacro MUI_PAGE_DIRECTORY
!insertmacro MUI_PAGE_INSTFILES
!insertmacro MUI_PAGE_FINISH
!insertmacro MUI_UNPAGE_CONFIRM
!insertmacro MUI_UNPAGE_INSTFILES
!insertmacro MUI_LANGUAGE "English"

Section "KVScope" SecMain
  SectionIn RO
  SetShellVarContext current
  SetOutPath "$INSTDIR"
  ; An upgrade replaces the previous bundle rather than mixing two versions' libraries.
  RMDir /r "$INSTDIR\_internal"
  File /r "${SRCDIR}\*"
  WriteUninstaller "$INSTDIR\uninstall.exe"

  CreateDirectory "$SMPROGRAMS\${APPNAME}"
  CreateShortCut "$SMPROGRAMS\${APPNAME}\${APPNAME}.lnk" "$INSTDIR\${EXENAME}" "" "$INSTDIR\${EXENAME}" 0
  CreateShortCut "$SMPROGRAMS\${APPNAME}\Uninstall ${APPNAME}.lnk" "$INSTDIR\uninstall.exe"
  CreateShortCut "$DESKTOP\${APPNAME}.lnk" "$INSTDIR\${EXENAME}" "" "$INSTDIR\${EXENAME}" 0

  WriteRegStr HKCU "Software\${APPNAME}" "InstallDir" "$INSTDIR"
  WriteRegStr HKCU "${UNINSTKEY}" "DisplayName" "${APPNAME}"
  WriteRegStr HKCU "${UNINSTKEY}" "DisplayVersion" "${VERSION}"
  WriteRegStr HKCU "${UNINSTKEY}" "Publisher" "${PUBLISHER}"
  WriteRegStr HKCU "${UNINSTKEY}" "DisplayIcon" "$INSTDIR\${EXENAME}"
  WriteRegStr HKCU "${UNINSTKEY}" "InstallLocation" "$INSTDIR"
  WriteRegStr HKCU "${UNINSTKEY}" "UninstallString" '"$INSTDIR\uninstall.exe"'
  WriteRegStr HKCU "${UNINSTKEY}" "QuietUninstallString" '"$INSTDIR\uninstall.exe" /S'
  WriteRegDWORD HKCU "${UNINSTKEY}" "NoModify" 1
  WriteRegDWORD HKCU "${UNINSTKEY}" "NoRepair" 1
SectionEnd

Section "Uninstall"
  SetShellVarContext current
  Delete "$DESKTOP\${APPNAME}.lnk"
  Delete "$SMPROGRAMS\${APPNAME}\${APPNAME}.lnk"
  Delete "$SMPROGRAMS\${APPNAME}\Uninstall ${APPNAME}.lnk"
  RMDir "$SMPROGRAMS\${APPNAME}"

  ; Only what the installer put there: never `RMDir /r $INSTDIR`, which would empty any folder a
  ; user chose to install into. The folder itself goes only once it is empty.
  RMDir /r "$INSTDIR\_internal"
  Delete "$INSTDIR\${EXENAME}"
  Delete "$INSTDIR\uninstall.exe"
  RMDir "$INSTDIR"

  DeleteRegKey HKCU "${UNINSTKEY}"
  DeleteRegKey HKCU "Software\${APPNAME}"
SectionEnd
